"""SmolLM3: Llama's block, but every fourth layer attends without RoPE
(NoPE: llama.cpp's smollm3 graph skips ggml_rope_ext where
(il + 1) % n_no_rope_layer_step == 0)."""
from typing import Any, Mapping

from ..archspec.hparams import Key, require_rope_over_whole_heads
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture, HParam

HPARAMS = (
    HParam("n_no_rope_layer_step", "int", 0,
           "layer il attends without RoPE where (il + 1) % this == 0 (SmolLM3: 4); 0: every layer rotates"),
)

# llama.cpp sets the step in llama_model_smollm3::load_arch_hparams and reads
# no key for it: the converter writes neither SmolLM3's no_rope_layers nor
# its no_rope_layer_interval, so every SmolLM3 GGUF is run with 4.
NO_ROPE_LAYER_STEP = 4


def smollm3_hparams(h: dict, key: Key, gguf: Any) -> None:
    require_rope_over_whole_heads(h, "smollm3")
    h["n_no_rope_layer_step"] = NO_ROPE_LAYER_STEP


def smollm3_shape(h: Mapping[str, Any]) -> str:
    step = h["n_no_rope_layer_step"]
    nope = [il for il in range(h["n_layer"]) if (il + 1) % step == 0]
    listed = ", ".join(map(str, nope[:6])) + (", ..." if len(nope) > 6 else "")
    return f"layer pattern: every {step}th layer without RoPE (NoPE), {len(nope)} of {h['n_layer']}: {listed}"


# Q/K/V biases where the file has them (create_tensor_qkv); no RoPE factors
# (llama.cpp's smollm3 takes none) and no output bias.
ARCH = Architecture("smollm3", "decoder", "normal", ATTN_FFN, optional=("bq", "bk", "bv"),
                    global_optional=("output",), derive=smollm3_hparams, shape=smollm3_shape,
                    description="SmolLM3-3B")
