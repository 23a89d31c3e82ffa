"""Architectures, declared as data.

Each entry says which metadata keys hold the hyperparameters (with their
defaults), which tensors each layer has and which of them are optional, the
RoPE type, the activation, and features such as a sliding window.  The graph
itself is built natively by the builder the entry names (``elelem/_native/graph/arch_*.pxi``).

Adding an architecture: one builder file (or reuse one), one entry in
ARCHITECTURES, one synthetic-model test case.

Everything is checked here, in Python, before the native core sees the file:
missing tensors, mis-shaped tensors and hyperparameters that do not fit all
raise :class:`~elelem.errors.ModelShapeError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import numpy as np

from ..errors import ModelShapeError, UnsupportedArchitectureError
from ..gguf.reader import GGUFFile

# Per-layer tensor roles (the native LayerWeights fields) and their GGUF names.
LAYER_TENSOR_NAMES = {
    "attn_norm": "blk.{i}.attn_norm.weight",
    "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight",
    "wv": "blk.{i}.attn_v.weight",
    "wo": "blk.{i}.attn_output.weight",
    "bq": "blk.{i}.attn_q.bias",
    "bk": "blk.{i}.attn_k.bias",
    "bv": "blk.{i}.attn_v.bias",
    "bo": "blk.{i}.attn_output.bias",
    "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight",
    "attn_post_norm": "blk.{i}.post_attention_norm.weight",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "ffn_gate": "blk.{i}.ffn_gate.weight",
    "ffn_up": "blk.{i}.ffn_up.weight",
    "ffn_down": "blk.{i}.ffn_down.weight",
    "ffn_post_norm": "blk.{i}.post_ffw_norm.weight",
    # BERT-family encoders
    "wqkv": "blk.{i}.attn_qkv.weight",
    "bqkv": "blk.{i}.attn_qkv.bias",
    "attn_out_norm": "blk.{i}.attn_output_norm.weight",
    "attn_out_norm_b": "blk.{i}.attn_output_norm.bias",
    "ffn_up_b": "blk.{i}.ffn_up.bias",
    "ffn_down_b": "blk.{i}.ffn_down.bias",
    "layer_out_norm": "blk.{i}.layer_output_norm.weight",
    "layer_out_norm_b": "blk.{i}.layer_output_norm.bias",
    # Attention sinks (gpt-oss): one learned logit per head, a cell no token fills.
    "attn_sinks": "blk.{i}.attn_sinks.weight",
    # Mixture of experts: the router, the experts stacked along a third
    # dimension (n_in, n_out, n_expert), their biases (gpt-oss), the expert
    # selection bias (GLM) and the shared experts (GLM).
    "ffn_gate_inp": "blk.{i}.ffn_gate_inp.weight",
    "ffn_gate_inp_b": "blk.{i}.ffn_gate_inp.bias",
    "ffn_gate_exps": "blk.{i}.ffn_gate_exps.weight",
    "ffn_up_exps": "blk.{i}.ffn_up_exps.weight",
    "ffn_down_exps": "blk.{i}.ffn_down_exps.weight",
    "ffn_gate_exps_b": "blk.{i}.ffn_gate_exps.bias",
    "ffn_up_exps_b": "blk.{i}.ffn_up_exps.bias",
    "ffn_down_exps_b": "blk.{i}.ffn_down_exps.bias",
    "ffn_exp_probs_b": "blk.{i}.exp_probs_b.bias",
    "ffn_gate_shexp": "blk.{i}.ffn_gate_shexp.weight",
    "ffn_up_shexp": "blk.{i}.ffn_up_shexp.weight",
    "ffn_down_shexp": "blk.{i}.ffn_down_shexp.weight",
    "ffn_gate_inp_shexp": "blk.{i}.ffn_gate_inp_shexp.weight",   # a sigmoid gate on the shared expert (Qwen)
    # Gated DeltaNet (Qwen3.5, Qwen3-Next): a recurrent layer.  Its Q, K and V
    # come through attn_qkv ("wqkv"), then a short causal convolution.
    "attn_gate": "blk.{i}.attn_gate.weight",
    "ssm_conv1d": "blk.{i}.ssm_conv1d.weight",
    "ssm_dt": "blk.{i}.ssm_dt.bias",
    "ssm_a": "blk.{i}.ssm_a",
    "ssm_beta": "blk.{i}.ssm_beta.weight",
    "ssm_alpha": "blk.{i}.ssm_alpha.weight",
    "ssm_norm": "blk.{i}.ssm_norm.weight",
    "ssm_out": "blk.{i}.ssm_out.weight",
    # Qwen3-Next's: beta and alpha in one projection, head group by head group; in
    # older files also Q, K, V and z in one (ssm_in), where newer ones have attn_qkv and attn_gate.
    "ssm_ba": "blk.{i}.ssm_ba.weight",
    "ssm_in": "blk.{i}.ssm_in.weight",
    # Gemma 4: the experts' gate and up in one stack (gate first), the router's
    # input scale, each expert's output scale, the norms of an expert layer's
    # two FFNs, the per-layer embeddings' gate, projection and norm, and a
    # scale of the layer's output.
    "ffn_gate_up_exps": "blk.{i}.ffn_gate_up_exps.weight",
    "ffn_gate_inp_s": "blk.{i}.ffn_gate_inp.scale",
    "ffn_down_exps_s": "blk.{i}.ffn_down_exps.scale",
    "ffn_pre_norm_2": "blk.{i}.pre_ffw_norm_2.weight",
    "ffn_post_norm_1": "blk.{i}.post_ffw_norm_1.weight",
    "ffn_post_norm_2": "blk.{i}.post_ffw_norm_2.weight",
    "per_layer_inp_gate": "blk.{i}.inp_gate.weight",
    "per_layer_proj": "blk.{i}.proj.weight",
    "per_layer_post_norm": "blk.{i}.post_norm.weight",
    "layer_out_scale": "blk.{i}.layer_output_scale.weight",
}
GLOBAL_TENSOR_NAMES = {
    "tok_embd": "token_embd.weight",
    "output_norm": "output_norm.weight",
    "output": "output.weight",
    "rope_freqs": "rope_freqs.weight",
    "pos_embd": "position_embd.weight",
    "type_embd": "token_types.weight",
    "tok_norm": "token_embd_norm.weight",
    "tok_norm_b": "token_embd_norm.bias",
    # Gemma 4's per-layer token embeddings: the table, the projection of the embeddings, its norm.
    "per_layer_tok_embd": "per_layer_token_embd.weight",
    "per_layer_model_proj": "per_layer_model_proj.weight",
    "per_layer_proj_norm": "per_layer_proj_norm.weight",
}

# ggml types the CPU backend can multiply (as the weight of a mul_mat) and
# look rows up in (get_rows); integer and 64-bit float tensors cannot be.
_MATRIX_TYPES = frozenset({
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0",
    "MXFP4",
})
# Norm weights, biases and RoPE factors take part in element-wise F32 ops.
_VECTOR_TYPES = frozenset({"F32"})
# Biases of the stacked experts are matrices (one row per expert) but are
# added (ggml_add_id), so they are F32 like the vectors.
_F32_MATRIX_ROLES = frozenset({"ffn_gate_exps_b", "ffn_up_exps_b", "ffn_down_exps_b", "type_embd",
                               "ssm_conv1d"})  # the convolution's kernel: ggml_ssm_conv takes F32
# llama.cpp's LLAMA_MAX_EXPERTS: it refuses more; and the experts one token
# is routed to, at most (graph/experts.pxi's MAX_USED_EXPERTS; real models use 4 to 10).
MAX_EXPERTS = 512
MAX_USED_EXPERTS = 64
# Bounds that keep every count a C int and every loop over layers short,
# checked before anything is sized from them.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 20

_MATMUL_ROLES = frozenset({"wq", "wk", "wv", "wqkv", "wo", "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp",
                           "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                           "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                           "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out", "ffn_gate_inp_shexp",
                           "ffn_gate_up_exps", "per_layer_inp_gate", "per_layer_proj", "ssm_in", "ssm_ba"})
_ATTN = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm")
_DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")
_ATTN_FFN = _ATTN + _DENSE_FFN
_EXPERTS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_EXPERT_BIASES = ("ffn_gate_inp_b", "ffn_gate_exps_b", "ffn_up_exps_b", "ffn_down_exps_b")
_SHARED_EXPERTS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
_DELTA_NET = ("attn_norm", "ffn_norm", "wqkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_beta",
              "ssm_alpha", "ssm_norm", "ssm_out")
# Qwen3-Next's recurrent layer: beta and alpha through ssm_ba; Q/K/V and z through
# wqkv and attn_gate, or (older files) ssm_in -- see Architecture.recurrent_fused.
_DELTA_NET_BY_GROUP = ("attn_norm", "ffn_norm", "wqkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_ba",
                       "ssm_norm", "ssm_out")
_DECODER_GLOBALS = ("tok_embd", "output_norm")
# BERT-family blocks: post-norm LayerNorms with biases; Q/K/V separate or fused.
_ENCODER_BLOCK = ("wo", "attn_out_norm", "attn_out_norm_b", "ffn_up", "ffn_down",
                  "layer_out_norm", "layer_out_norm_b")
_ENCODER_OPTIONAL = ("wq", "wk", "wv", "bq", "bk", "bv", "wqkv", "bqkv", "bo", "ffn_up_b", "ffn_down_b")


@dataclass(frozen=True)
class Experts:
    """How an architecture's expert FFN routes tokens: the arguments
    llama.cpp's build_moe_ffn takes for it.  Layers from
    ``leading_dense_block_count`` on have experts, those before it the dense
    FFN (GLM-4.5's first layer)."""
    gating: str = "softmax"          # router probabilities: "softmax", "sigmoid", or "softmax_weight"
                                     # (the raw logits, softmax over the chosen experts only: gpt-oss)
    normalize: Optional[bool] = True # renormalise the chosen weights to sum 1; None: the file says
                                     # (expert_weights_norm)
    activation: str = "silu"         # SwiGLU, "swiglu_oai": gpt-oss's clamped variant, or "gelu": GeGLU (Gemma 4)
    required: tuple[str, ...] = _EXPERTS   # per-layer roles of an expert layer
    optional: tuple[str, ...] = ()


# The router's gating functions as HParams.expert_gating numbers (blocks.pxi).
_GATING = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}
# llama.cpp's LLM_KV_EXPERT_GATING_FUNC values.
_GATING_KEY = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


@dataclass(frozen=True)
class Architecture:
    name: str
    builder: str                      # native graph builder: "qwen2_family" or "gemma3"
    rope_type: str                    # "neox" (rotate halves) or "normal" (rotate pairs)
    required: tuple[str, ...]         # per-layer roles that must exist
    optional: tuple[str, ...] = ()    # per-layer roles used when present
    activation: str = "silu"          # gated FFN activation: "silu" or "gelu"
    # hyperparameter hooks: derive what is special to this architecture
    derive: Optional[Callable[[dict, Callable[[str, Any], Any], GGUFFile], None]] = None
    description: str = ""
    global_required: tuple[str, ...] = _DECODER_GLOBALS   # model-wide roles that must exist
    global_optional: tuple[str, ...] = ("output", "rope_freqs")
    encoder: bool = False             # no output head: embeddings only (BERT family)
    experts: Optional[Experts] = None # a mixture-of-experts FFN (its layers lack the dense FFN roles)
    tensor_names: Mapping[str, str] = field(default_factory=dict)  # roles under another GGUF name
    recurrent: tuple[str, ...] = ()   # roles of a recurrent layer (hparams' recurrent_layers say which)
    # a fused recurrent role -> the roles it stands in for where the file has it and not
    # all of them (llama.cpp takes the separate ones where both are there)
    recurrent_fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # (hparams, layer, the file's tensor names) -> (required, optional) roles of that layer, where
    # they differ from layer to layer beyond what ``experts`` says (Gemma 4)
    layer_roles: Optional[Callable[[Mapping[str, Any], int, Mapping[str, Any]],
                                   tuple[tuple[str, ...], tuple[str, ...]]]] = None
    per_layer_shapes: bool = False   # head_count_kv and feed_forward_length may differ per layer


def _gemma3(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    # Gemma 3 scales embeddings by sqrt(n_embd).  With a sliding window, layer
    # il attends over the window unless il % pattern == pattern - 1 (pattern 6:
    # five local layers, then one global); local layers use rope.freq_base_swa
    # (default 10000, as llama.cpp), global ones rope.freq_base.  Q is scaled
    # by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 62-layer 27B).
    h["embd_scale"] = math.sqrt(h["n_embd"])
    h["n_swa"] = int(key("attention.sliding_window", 0))
    if h["n_swa"] > 0:
        pattern = int(key("attention.sliding_window_pattern", 6))
        h["swa_layers"] = [pattern == 0 or il % pattern < pattern - 1 for il in range(h["n_layer"])]
    h["rope_base_swa"] = float(key("rope.freq_base_swa", 10000.0))
    # Linear RoPE scaling (Gemma 3 4B-27B: factor 8) is for the global layers
    # only: llama.cpp's rope_freq_scale_train_swa is 1 for gemma3.
    h["rope_scale_swa"] = 1.0
    width = h["n_embd"] / h["n_head"] if h["n_layer"] == 62 else h["head_dim_k"]
    h["attn_scale"] = 1.0 / math.sqrt(width)


def _encoder(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    # As llama.cpp reads a BERT-family file: LayerNorm's epsilon is required,
    # attention is causal unless the file says otherwise (converters write
    # false), and the token-type table's height is the tokenizer's count.
    h["encoder"] = True
    h["norm_eps"] = float(key("attention.layer_norm_epsilon"))
    causal_key = gguf.get("general.architecture") + ".attention.causal"
    causal = gguf.get(causal_key, True)
    if not isinstance(causal, bool):
        raise ModelShapeError(f"{causal_key} = {causal!r} must be a boolean")
    h["causal"] = causal
    types = gguf.get("tokenizer.ggml.token_type_count", 0)
    if isinstance(types, bool) or not isinstance(types, int) or not 0 < types <= 1024:
        raise ModelShapeError(f"tokenizer.ggml.token_type_count = {types!r}: a BERT-family model needs "
                              f"a token type count in 1..1024")
    h["n_token_types"] = types
    if not (h["norm_eps"] > 0 and math.isfinite(h["norm_eps"])):
        raise ModelShapeError(f"attention.layer_norm_epsilon = {h['norm_eps']} must be positive")


def _flag(gguf: GGUFFile, key: str, default: bool) -> bool:
    value = gguf.get(key, default)
    if not isinstance(value, bool):
        raise ModelShapeError(f"{key} = {value!r} must be a boolean")
    return value


def _expert_hparams(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile, experts: Experts) -> None:
    """The routing hyperparameters of a mixture-of-experts model, as
    llama.cpp reads them, checked before anything is sized from them."""
    prefix = gguf.get("general.architecture") + "."
    h["n_expert"] = n_expert = int(key("expert_count", 0))
    h["n_expert_used"] = n_used = int(key("expert_used_count", 0))
    if not 0 < n_expert <= MAX_EXPERTS:
        raise ModelShapeError(f"{prefix}expert_count = {n_expert} must be in 1..{MAX_EXPERTS}")
    if not 0 < n_used <= min(n_expert, MAX_USED_EXPERTS):
        raise ModelShapeError(f"{prefix}expert_used_count = {n_used} must be in 1..{prefix}expert_count "
                              f"({n_expert}), and at most {MAX_USED_EXPERTS}")
    h["n_ff_exp"] = int(key("expert_feed_forward_length", h["n_ff"] // n_used))
    h["n_expert_shared"] = int(key("expert_shared_count", 0))
    h["n_ff_shexp"] = h["n_ff_exp"] * h["n_expert_shared"]
    shared_width = int(key("expert_shared_feed_forward_length", 0))   # Qwen's one shared expert
    if shared_width:
        h["n_expert_shared"], h["n_ff_shexp"] = 1, shared_width
    h["n_layer_dense_lead"] = int(key("leading_dense_block_count", 0))
    if not 0 < h["n_ff_exp"] <= MAX_WIDTH or not 0 <= h["n_expert_shared"] <= 64:
        raise ModelShapeError(f"{prefix}expert_feed_forward_length = {h['n_ff_exp']} or "
                              f"expert_shared_count = {h['n_expert_shared']} is out of range")
    if not 0 <= h["n_layer_dense_lead"] <= h["n_layer"]:
        raise ModelShapeError(f"{prefix}leading_dense_block_count = {h['n_layer_dense_lead']} is out of range")
    gating = experts.gating
    if gguf.get(prefix + "expert_gating_func") is not None:
        code = int(key("expert_gating_func"))
        if code != 0:  # 0: unset, the architecture's own
            if code not in _GATING_KEY:
                raise ModelShapeError(f"{prefix}expert_gating_func = {code} is not one elelem knows "
                                      f"(1 softmax, 2 sigmoid, 3 softmax over the chosen)")
            gating = _GATING_KEY[code]
    h["expert_gating"] = _GATING[gating]
    h["expert_norm"] = (experts.normalize if experts.normalize is not None
                        else _flag(gguf, prefix + "expert_weights_norm", False))
    h["expert_scale"] = float(key("expert_weights_scale", 0.0))
    h["expert_swiglu_oai"] = experts.activation == "swiglu_oai"
    h["expert_gelu"] = experts.activation == "gelu"


def _nextn(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    # Multi-token-prediction (NextN) blocks are counted in block_count but
    # come after the model's layers; llama.cpp's main graph skips them, and
    # so does elelem (their weights stay mapped, never read).
    nextn = int(key("nextn_predict_layers", 0))
    if not 0 <= nextn < h["n_layer"]:
        raise ModelShapeError(f"nextn_predict_layers = {nextn} must be below block_count = {h['n_layer']}")
    h["n_layer_nextn"] = nextn
    h["n_layer"] -= nextn


def _swa_pattern(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile, default: int) -> None:
    """Which layers attend over the sliding window, as llama.cpp's
    set_swa_pattern: every layer but each ``pattern``-th (an array in the
    file names them one by one)."""
    prefix = gguf.get("general.architecture") + "."
    raw = gguf.get(prefix + "attention.sliding_window_pattern", default)
    if isinstance(raw, list):
        if len(raw) < h["n_layer"] or not all(isinstance(v, (bool, int)) for v in raw):
            raise ModelShapeError(f"{prefix}attention.sliding_window_pattern must hold a flag per layer")
        h["swa_layers"] = [bool(v) for v in raw[:h["n_layer"]]]
        return
    pattern = int(key("attention.sliding_window_pattern", default))
    if pattern < 0:
        raise ModelShapeError(f"{prefix}attention.sliding_window_pattern = {pattern} must not be negative")
    h["swa_layers"] = [pattern == 0 or il % pattern < pattern - 1 for il in range(h["n_layer"])]


def _gpt_oss(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    # Sliding-window and full attention layers alternate (pattern 2: even
    # layers slide), both with the same RoPE unless the file gives the
    # window's own base; Q.K is scaled by 1/sqrt(n_rot).
    h["n_swa"] = int(key("attention.sliding_window"))
    _swa_pattern(h, key, gguf, 2)
    h["rope_base_swa"] = float(key("rope.freq_base_swa", h["rope_base"]))
    h["rope_scale_swa"] = h["rope_scale"]
    h["attn_scale"] = 1.0 / math.sqrt(h["n_rot"])
    h["late_output_rows"] = True


def _int_list(value: Any) -> Optional[list[int]]:
    """An integer (or boolean) array of the file as a list of ints, or None if it is not one."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iub":
        return [int(x) for x in value]
    if isinstance(value, list) and all(isinstance(x, (bool, int, np.integer)) for x in value):
        return [int(x) for x in value]
    return None


def _delta_net_hparams(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    """What Qwen3.5 and Qwen3-Next share: the Gated DeltaNet layers' widths, and
    which layers recur (attention.recurrent_layers, else every layer but each
    ``full_attention_interval``-th), as llama.cpp reads them; multi-token
    prediction layers skipped.  The attention layers' Q projection also
    carries an output gate."""
    prefix = gguf.get("general.architecture") + "."
    _nextn(h, key, gguf)
    for name, k in (("ssm_d_conv", "ssm.conv_kernel"), ("ssm_d_inner", "ssm.inner_size"),
                    ("ssm_d_state", "ssm.state_size"), ("ssm_n_group", "ssm.group_count"),
                    ("ssm_dt_rank", "ssm.time_step_rank")):
        h[name] = int(key(k))
        if not 0 < h[name] <= MAX_WIDTH:
            raise ModelShapeError(f"{prefix}{k} = {h[name]} is out of range")
    if not 2 <= h["ssm_d_conv"] <= 64:
        raise ModelShapeError(f"{prefix}ssm.conv_kernel = {h['ssm_d_conv']} must be in 2..64")
    if h["ssm_d_inner"] % h["ssm_dt_rank"] or h["ssm_dt_rank"] % h["ssm_n_group"] \
            or h["ssm_d_inner"] // h["ssm_dt_rank"] != h["ssm_d_state"]:
        raise ModelShapeError(f"{prefix}ssm.inner_size = {h['ssm_d_inner']} must be ssm.time_step_rank "
                              f"({h['ssm_dt_rank']}) value heads of ssm.state_size ({h['ssm_d_state']}), "
                              f"a multiple of ssm.group_count ({h['ssm_n_group']}) key heads")
    raw = gguf.get(prefix + "attention.recurrent_layers")
    if raw is not None:
        flags = _int_list(raw)
        if flags is None or len(flags) < h["n_layer"]:
            raise ModelShapeError(f"{prefix}attention.recurrent_layers must hold a flag per layer")
        h["recurrent_layers"] = [bool(f) for f in flags[:h["n_layer"]]]
    else:
        interval = int(key("full_attention_interval", 4))
        if not 0 < interval <= h["n_layer"] or h["n_layer"] % interval:
            raise ModelShapeError(f"{prefix}full_attention_interval = {interval} must divide "
                                  f"block_count ({h['n_layer']})")
        h["recurrent_layers"] = [(il + 1) % interval != 0 for il in range(h["n_layer"])]
    h["q_gate"] = True
    h["late_output_rows"] = True   # llama.cpp's qwen35 and qwen3next drop unwanted rows after their last layer


def _qwen35(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    """Qwen3.5's hybrid: Gated DeltaNet layers, and every
    ``full_attention_interval``-th layer full attention whose Q projection
    also carries an output gate; interleaved multi-section RoPE (imrope)."""
    prefix = gguf.get("general.architecture") + "."
    _delta_net_hparams(h, key, gguf)
    sections = _int_list(gguf.get(prefix + "rope.dimension_sections"))
    if sections is None or len(sections) != 4 or not all(0 <= x <= h["n_rot"] for x in sections):
        raise ModelShapeError(f"{prefix}rope.dimension_sections must be 4 section widths")
    h["rope_sections"] = sections
    h["rope_type"] = "imrope"


def _qwen3next(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    """Qwen3-Next's hybrid, as llama.cpp's llama_model_qwen3next reads it:
    Qwen3.5's layers with NEOX RoPE, value heads grouped by key head, and in
    every layer experts plus one shared expert, gated, whose width defaults
    to feed_forward_length."""
    _delta_net_hparams(h, key, gguf)
    h["ssm_v_grouped"] = True
    if h["n_expert_shared"] == 0:
        h["n_expert_shared"], h["n_ff_shexp"] = 1, h["n_ff"]


def _mistral3(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    # Attention temperature (llama.cpp's llama-4-style tuning): Q is scaled
    # by 1 + temperature_scale * log(floor(pos / n_ctx_orig_yarn) + 1).
    h["attn_temp_scale"] = float(key("attention.temperature_scale", 0.0))
    h["attn_temp_floor"] = h["n_ctx_orig"]
    if h["attn_temp_scale"] != 0.0 and not 0 < h["attn_temp_floor"] < 2**31:
        raise ModelShapeError("attention temperature scaling needs rope.scaling.original_context_length > 0")


# Gemma 4's experts: softmax over the router's logits, the chosen renormalised, GeGLU
# (llama.cpp's gemma4 graph passes these to build_moe_ffn, whatever the file says).
_GEMMA4_EXPERTS = Experts(gating="softmax", normalize=True, activation="gelu",
                          required=("ffn_gate_inp", "ffn_gate_inp_s", "ffn_down_exps", "ffn_pre_norm_2",
                                    "ffn_post_norm_1", "ffn_post_norm_2"),
                          optional=("ffn_down_exps_s",))
_GEMMA4_LAYER = ("attn_norm", "wq", "wo", "q_norm", "attn_post_norm", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down", "ffn_post_norm")
_GEMMA4_PER_LAYER_EMBD = ("per_layer_inp_gate", "per_layer_proj", "per_layer_post_norm")


def _gemma4(h: dict, key: Callable[[str, Any], Any], gguf: GGUFFile) -> None:
    """As llama.cpp's llama_model_gemma4::load_arch_hparams.

    Layers slide or not as the per-layer attention.sliding_window_pattern
    says; sliding layers have their own head widths (key_length_swa,
    value_length_swa), rotated dims (rope.dimension_count_swa, default
    rope.dimension_count) and RoPE base (rope.freq_base_swa, default 10000,
    never scaled), and head_count_kv may differ per layer.  The last
    attention.shared_kv_layers layers store no K and V: each attends over
    those of the last earlier layer of its kind (llama.cpp's
    n_layer_kv_from_start and its reuse callback).  Embeddings are scaled by
    sqrt(n_embd), Q.K by 1, and the logits are soft-capped by
    final_logit_softcapping where given.  Layers with a router (ffn_gate_inp)
    add the experts (expert_count ...) to the dense FFN."""
    prefix = "gemma4."
    n_all = h["n_layer"]
    _nextn(h, key, gguf)
    n = h["n_layer"]
    h["embd_scale"] = math.sqrt(h["n_embd"])
    h["attn_scale"] = 1.0
    h["n_swa"] = int(key("attention.sliding_window"))
    raw = _array(gguf.get(prefix + "attention.sliding_window_pattern"))
    if raw is None or len(raw) < n or not all(isinstance(v, (bool, int)) for v in raw):
        raise ModelShapeError(f"{prefix}attention.sliding_window_pattern must hold a flag per layer ({n} layers)")
    swa = h["swa_layers"] = [bool(v) for v in raw[:n]]
    if any(swa) and h["n_swa"] <= 0:
        raise ModelShapeError(f"{prefix}attention.sliding_window = {h['n_swa']} must be positive: "
                              f"{prefix}attention.sliding_window_pattern has sliding layers")
    h["rope_base_swa"] = float(key("rope.freq_base_swa", 10000.0))
    h["rope_scale_swa"] = 1.0
    h["n_embd_per_layer"] = n_pl = int(key("embedding_length_per_layer_input"))
    if not 0 <= n_pl <= MAX_WIDTH:
        raise ModelShapeError(f"{prefix}embedding_length_per_layer_input = {n_pl} is out of range")
    h["final_logit_softcap"] = cap = float(key("final_logit_softcapping", 0.0))
    if cap < 0:
        raise ModelShapeError(f"{prefix}final_logit_softcapping = {cap} must not be negative")
    dims_swa = int(key("attention.key_length_swa")), int(key("attention.value_length_swa"))
    dims_full = h["head_dim_k"], h["head_dim_v"]
    for name, (k_dim, v_dim) in (("key_length", dims_full), ("key_length_swa", dims_swa)):
        if k_dim != v_dim:
            raise ModelShapeError(f"{prefix}attention.{name} = {k_dim} differs from the value length {v_dim}: "
                                  f"Gemma 4 needs them equal")
        if not 0 < k_dim <= 4096:
            raise ModelShapeError(f"{prefix}attention.{name} = {k_dim} is out of range")
    n_rot_swa = int(key("rope.dimension_count_swa", h["n_rot"]))
    if not 0 < n_rot_swa <= dims_swa[0] or n_rot_swa % 2:
        raise ModelShapeError(f"{prefix}rope.dimension_count_swa = {n_rot_swa} must be even and at most "
                              f"{prefix}attention.key_length_swa = {dims_swa[0]}")
    kv_heads = h.pop("layer_n_head_kv", [h["n_head_kv"]] * n)
    for il, heads in enumerate(kv_heads):
        if h["n_head"] % heads:
            raise ModelShapeError(f"{prefix}attention.head_count_kv = {heads} (layer {il}) does not divide "
                                  f"head_count = {h['n_head']}")
    shared = int(key("attention.shared_kv_layers", 0))
    first_shared = n_all - shared
    if not 0 <= shared < n_all or (shared and first_shared < 2):
        raise ModelShapeError(f"{prefix}attention.shared_kv_layers = {shared} must leave at least 2 of the "
                              f"{n_all} layers with K/V of their own")
    sources = []
    for il in range(n):
        src = il if il < first_shared else first_shared - (2 if swa[il] else 1)
        if src != il and (swa[src] != swa[il] or kv_heads[src] != kv_heads[il]):
            raise ModelShapeError(f"layer {il} would share the K/V of layer {src}, which is "
                                  f"{'not ' if swa[il] else ''}a sliding-window layer "
                                  f"({prefix}attention.shared_kv_layers = {shared}, sliding_window_pattern)")
        sources.append(src)
    h["layer_n_head_kv"] = kv_heads
    h["layer_head_dim_k"] = [dims_swa[0] if s else dims_full[0] for s in swa]
    h["layer_head_dim_v"] = [dims_swa[1] if s else dims_full[1] for s in swa]
    h["layer_n_rot"] = [n_rot_swa if s else h["n_rot"] for s in swa]
    h["layer_kv_source"] = sources
    h["n_head_kv"] = max(kv_heads)
    # The full-attention layers rotate through rope_freqs (head_dim / 2 factors).
    h["rope_freqs_dims"] = dims_full[0]
    if not all(swa) and GLOBAL_TENSOR_NAMES["rope_freqs"] not in gguf.tensors:
        raise ModelShapeError(f"required tensor {GLOBAL_TENSOR_NAMES['rope_freqs']!r} is missing "
                              f"(Gemma 4's global layers rotate through it)")
    if n_pl:
        for role in ("per_layer_tok_embd", "per_layer_model_proj", "per_layer_proj_norm"):
            if GLOBAL_TENSOR_NAMES[role] not in gguf.tensors:
                raise ModelShapeError(f"required tensor {GLOBAL_TENSOR_NAMES[role]!r} is missing "
                                      f"({prefix}embedding_length_per_layer_input = {n_pl})")
    routers = any(LAYER_TENSOR_NAMES["ffn_gate_inp"].format(i=il) in gguf.tensors for il in range(n))
    if routers or gguf.get(prefix + "expert_count") is not None:
        _expert_hparams(h, key, gguf, _GEMMA4_EXPERTS)
        h["expert_gating"] = _GATING["softmax"]
        h["expert_norm"] = True
        h["expert_scale"] = 0.0


def _gemma4_layer_roles(h: Mapping[str, Any], i: int, tensors: Mapping[str, Any]):
    """A Gemma 4 layer's roles: K (and its norm) where it stores its own K/V
    (V is optional: without it V is K), the per-layer embeddings' where the
    model has them, and the experts where the layer has a router (their gate
    and up stacked in one tensor, or two)."""
    required, optional = _GEMMA4_LAYER, ("layer_out_scale",)
    kv = ("wk", "k_norm")
    if h["layer_kv_source"][i] == i:
        required, optional = required + kv, optional + ("wv",)
    else:   # a shared layer's own K/V weights, if the file has them, go unused
        optional = optional + kv + ("wv",)
    if h.get("n_embd_per_layer", 0) > 0:
        required = required + _GEMMA4_PER_LAYER_EMBD
    if LAYER_TENSOR_NAMES["ffn_gate_inp"].format(i=i) in tensors:
        fused = LAYER_TENSOR_NAMES["ffn_gate_up_exps"].format(i=i) in tensors
        required = required + _GEMMA4_EXPERTS.required + (
            ("ffn_gate_up_exps",) if fused else ("ffn_gate_exps", "ffn_up_exps"))
        optional = optional + _GEMMA4_EXPERTS.optional
    return required, optional


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("qwen2", "qwen2_family", "neox", _ATTN_FFN, optional=("bq", "bk", "bv", "bo"),
                     description="Qwen2 / Qwen2.5"),
        Architecture("llama", "qwen2_family", "normal", _ATTN_FFN, optional=("bq", "bk", "bv", "bo"),
                     description="Llama 2/3, SmolLM2, TinyLlama, Mistral-style"),
        Architecture("qwen3", "qwen2_family", "neox", _ATTN_FFN + ("q_norm", "k_norm"),
                     description="Qwen3"),
        Architecture("gemma3", "gemma3", "neox",
                     _ATTN_FFN + ("q_norm", "k_norm", "attn_post_norm", "ffn_post_norm"),
                     activation="gelu", derive=_gemma3, description="Gemma 3"),
        Architecture("qwen3moe", "decoder", "neox", _ATTN + ("q_norm", "k_norm"), experts=Experts(),
                     description="Qwen3-MoE, Qwen3-Coder (30B-A3B, 480B-A35B)"),
        Architecture("gpt-oss", "decoder", "neox", _ATTN + ("bq", "bk", "bv", "bo", "attn_sinks"),
                     experts=Experts(gating="softmax_weight", normalize=False, activation="swiglu_oai",
                                     required=_EXPERTS + _EXPERT_BIASES),
                     tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight"}, derive=_gpt_oss,
                     description="gpt-oss (20b, 120b)"),
        Architecture("glm4moe", "decoder", "neox", _ATTN, optional=("bq", "bk", "bv", "q_norm", "k_norm"),
                     experts=Experts(gating="sigmoid", normalize=None,
                                     required=_EXPERTS + ("ffn_exp_probs_b",)),
                     tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight"}, derive=_nextn,
                     description="GLM-4.5, GLM-4.5-Air, GLM-4.6"),
        Architecture("qwen35", "qwen35", "neox", _ATTN_FFN + ("q_norm", "k_norm"), recurrent=_DELTA_NET + _DENSE_FFN,
                     tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight"}, derive=_qwen35,
                     description="Qwen3.5 / Qwen3.6 (Gated DeltaNet hybrid)"),
        Architecture("qwen35moe", "qwen35", "neox", _ATTN + ("q_norm", "k_norm"), recurrent=_DELTA_NET,
                     experts=Experts(optional=("ffn_gate_inp_shexp",)),
                     tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight"}, derive=_qwen35,
                     description="Qwen3.5 / Qwen3.6 MoE (Gated DeltaNet hybrid with experts)"),
        Architecture("qwen3next", "qwen35", "neox", _ATTN + ("q_norm", "k_norm"), recurrent=_DELTA_NET_BY_GROUP,
                     recurrent_fused={"ssm_in": ("wqkv", "attn_gate")},
                     experts=Experts(required=_EXPERTS + ("ffn_gate_inp_shexp",)),
                     tensor_names={"ffn_norm": "blk.{i}.post_attention_norm.weight"}, derive=_qwen3next,
                     description="Qwen3-Next, Qwen3-Coder-Next (Gated DeltaNet hybrid with experts)"),
        Architecture("mistral3", "decoder", "normal", _ATTN_FFN, optional=("bo",), derive=_mistral3,
                     description="Mistral 3: Ministral 3, Devstral Small 2, Mistral Small 3.x"),
        Architecture("gemma4", "gemma4", "neox", _GEMMA4_LAYER, activation="gelu", derive=_gemma4,
                     layer_roles=_gemma4_layer_roles, per_layer_shapes=True,
                     global_optional=("output", "rope_freqs", "per_layer_tok_embd", "per_layer_model_proj",
                                      "per_layer_proj_norm"),
                     description="Gemma 4 (E2B, E4B, 31B; 26B-A4B: experts)"),
        Architecture("bert", "bert", "neox", _ENCODER_BLOCK, optional=_ENCODER_OPTIONAL,
                     activation="gelu", derive=_encoder, encoder=True,
                     global_required=("tok_embd", "pos_embd", "tok_norm", "tok_norm_b"),
                     global_optional=("type_embd",),
                     description="BERT encoders (embedding models: MiniLM, BGE, E5, ...)"),
        Architecture("nomic-bert", "bert", "neox", _ENCODER_BLOCK + ("ffn_gate",), optional=_ENCODER_OPTIONAL,
                     derive=_encoder, encoder=True,
                     global_required=("tok_embd", "tok_norm", "tok_norm_b"), global_optional=("type_embd",),
                     description="Nomic BERT encoders (nomic-embed-text)"),
    )
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


@dataclass
class ModelSpec:
    """What the native core needs to open a model: all of it validated."""
    arch: Architecture
    hparams: dict[str, Any]
    global_tensors: dict[str, Optional[str]]
    layer_tensors: list[dict[str, Optional[str]]] = field(default_factory=list)

    def matmul_weights(self) -> list[str]:
        """Tensors used as the weight operand of a matrix multiplication."""
        names = [n for table in self.layer_tensors for role, n in table.items() if role in _MATMUL_ROLES]
        if self.global_tensors.get("per_layer_model_proj"):
            names.append(self.global_tensors["per_layer_model_proj"])
        if not self.arch.encoder:  # an encoder has no output projection
            names.append(self.global_tensors["output"] or self.global_tensors["tok_embd"])
        return names

    def widened_bytes(self, tensors: dict, excluded=frozenset()) -> int:
        """The memory Q8_0 copies of the Q5_0 matmul weights (but ``excluded``)
        would take, from the file's tensor table: 34 bytes for each 22-byte
        block (elelem/_native/widen.pxi)."""
        return sum(tensors[n].nbytes // 22 * 34 for n in set(self.matmul_weights()) - set(excluded)
                   if n in tensors and tensors[n].type_name == "Q5_0")

    @property
    def description(self) -> str:
        h = self.hparams
        ffn = (f"{h['n_expert']} experts ({h['n_expert_used']} used) of n_ff {h['n_ff_exp']}"
               if "n_expert" in h else f"n_ff {h['n_ff']}")
        return (f"{self.arch.name}: {h['n_layer']} layers, n_embd {h['n_embd']}, "
                f"{h['n_head']} heads ({h['n_head_kv']} KV), {ffn}, "
                f"vocab {h['n_vocab']}, trained context {h['n_ctx_train']}")

    def parameter_counts(self, tensors: Mapping[str, Any]) -> tuple[int, int]:
        """(total, active): the weights' element count, and how many of them
        one token reads -- the experts it is routed to, not all of them (the
        embedding table counts once, as llama.cpp's n_params does)."""
        total = active = 0
        used = set()
        for table in [self.global_tensors] + self.layer_tensors:
            used.update(n for n in table.values() if n)
        for name in used:
            n = math.prod(tensors[name].shape)
            total += n
            is_expert = any(name.endswith(s) for s in ("_exps.weight", "_exps.bias"))
            active += n * self.hparams["n_expert_used"] // self.hparams["n_expert"] if is_expert else n
        return total, active


def model_spec(gguf: GGUFFile) -> ModelSpec:
    """Read and check the hyperparameters and tensor table of ``gguf``."""
    arch_name = gguf.get("general.architecture")
    if not isinstance(arch_name, str):
        raise UnsupportedArchitectureError("the file has no general.architecture key")
    arch = ARCHITECTURES.get(arch_name)
    if arch is None:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {arch_name!r}; supported: {', '.join(supported_architectures())}")
    hparams = _hparams(gguf, arch)
    tensors = _tensor_tables(gguf, arch, hparams)
    return ModelSpec(arch, hparams, *tensors)


def _hparams(gguf: GGUFFile, arch: Architecture) -> dict[str, Any]:
    prefix = arch.name + "."

    def key(name: str, default: Any = None) -> Any:
        value = gguf.get(prefix + name, default)
        if value is None:
            raise ModelShapeError(f"missing hyperparameter {prefix + name}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not math.isfinite(value)):
            raise ModelShapeError(f"{prefix + name} = {value!r} must be a finite number")
        return value

    embd = gguf.tensors.get(GLOBAL_TENSOR_NAMES["tok_embd"])
    if embd is None or len(embd.shape) != 2:
        raise ModelShapeError("tensor 'token_embd.weight' is missing or not 2-D")
    h: dict[str, Any] = {
        "n_vocab": int(embd.shape[1]),
        "n_embd": int(key("embedding_length")),
        "n_layer": int(key("block_count")),
        "n_head": int(key("attention.head_count")),
        "n_ctx_train": int(key("context_length")),
        "rms_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_base": float(key("rope.freq_base", 10000.0)),
        "rope_type": arch.rope_type,
    }
    if not 0 < h["n_layer"] <= MAX_LAYERS:
        raise ModelShapeError(f"hyperparameter n_layer = {h['n_layer']} is out of range")
    # A model whose every layer has experts may have no dense FFN width.
    h["n_ff"] = _per_layer_key(h, gguf, arch, key, "feed_forward_length", "layer_n_ff",
                               gguf.get(prefix + "expert_feed_forward_length") if arch.experts else None)
    h["n_head_kv"] = _per_layer_key(h, gguf, arch, key, "attention.head_count_kv", "layer_n_head_kv", h["n_head"])
    for name in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_ctx_train", "n_vocab"):
        if not 0 < h[name] < 2**31:
            raise ModelShapeError(f"hyperparameter {name} = {h[name]} is out of range")
    last_layer = f"blk.{h['n_layer'] - 1}."
    if h["n_layer"] > MAX_LAYERS or not any(name.startswith(last_layer) for name in gguf.tensors):
        raise ModelShapeError(f"block_count = {h['n_layer']} does not match the file's layers")
    for name in ("n_embd", "n_head", "n_head_kv", "n_ff"):
        if h[name] > MAX_WIDTH:
            raise ModelShapeError(f"hyperparameter {name} = {h[name]} is out of range")
    if gguf.get(prefix + "attention.key_length") is None and h["n_embd"] % h["n_head"] != 0:
        raise ModelShapeError(f"n_head = {h['n_head']} does not divide n_embd = {h['n_embd']}")
    h["head_dim_k"] = int(key("attention.key_length", h["n_embd"] // h["n_head"]))
    h["head_dim_v"] = int(key("attention.value_length", h["head_dim_k"]))
    for name in ("head_dim_k", "head_dim_v"):
        if not 0 < h[name] <= 4096:
            raise ModelShapeError(f"{name} = {h[name]} is out of range")
    h["n_rot"] = int(key("rope.dimension_count", h["head_dim_k"]))
    h.update(_rope_scaling(gguf, prefix, key, h["n_ctx_train"]))
    h["attn_scale"] = 1.0 / math.sqrt(h["head_dim_k"])
    if arch.experts is not None:
        _expert_hparams(h, key, gguf, arch.experts)
    if arch.derive is not None:
        arch.derive(h, key, gguf)

    if h["n_head"] % h["n_head_kv"] != 0:
        raise ModelShapeError(f"n_head_kv = {h['n_head_kv']} does not divide n_head = {h['n_head']}")
    for name in ("head_dim_k", "head_dim_v"):
        if not 0 < h[name] <= 4096:
            raise ModelShapeError(f"{name} = {h[name]} is out of range")
    if not (0 < h["n_rot"] <= h["head_dim_k"]) or h["n_rot"] % 2:
        raise ModelShapeError(f"rope.dimension_count = {h['n_rot']} must be even and at most {h['head_dim_k']}")
    if not (h["rms_eps"] > 0 and math.isfinite(h["rms_eps"])):
        raise ModelShapeError(f"layer_norm_rms_epsilon = {h['rms_eps']} must be positive")
    if not (h["rope_base"] > 0 and math.isfinite(h["rope_base"])):
        raise ModelShapeError(f"rope.freq_base = {h['rope_base']} must be positive")
    if not 0 <= h.get("n_swa", 0) < 2**31:
        raise ModelShapeError(f"attention.sliding_window = {h['n_swa']} is out of range")
    for name in ("rope_base_swa", "rope_scale", "rope_scale_swa", "attn_scale", "embd_scale"):
        if name in h and not (math.isfinite(h[name]) and h[name] > 0):
            raise ModelShapeError(f"{name} = {h[name]} must be a positive number")
    return h


def _array(value: Any) -> Optional[list]:
    """A GGUF array as a list (the reader gives numeric ones as numpy arrays), else None."""
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim == 1 else None
    return list(value) if isinstance(value, list) else None


def _per_layer_key(h: dict, gguf: GGUFFile, arch: Architecture, key: Callable[[str, Any], Any], name: str,
                   layer_name: str, default: Any) -> int:
    """A hyperparameter llama.cpp reads as one number or one per layer
    (get_key_or_arr): the number, or for an array of equal values that value.
    An array of differing values is kept as ``h[layer_name]`` where the
    architecture has per-layer shapes (Gemma 4; the number returned is then
    the largest), and refused elsewhere."""
    full = _array(gguf.get(arch.name + "." + name))
    if full is None:
        return int(key(name, default))
    n = h["n_layer"]
    if len(full) < n or not all(isinstance(v, int) and not isinstance(v, bool) for v in full):
        raise ModelShapeError(f"{arch.name}.{name} must be a number or an integer per layer ({n} layers)")
    values = [int(v) for v in full[:n]]
    if any(not 0 < v < 2**31 for v in values):
        raise ModelShapeError(f"{arch.name}.{name} = {values} is out of range")
    if len(set(values)) > 1:
        if not arch.per_layer_shapes:
            raise ModelShapeError(f"{arch.name}.{name} differs from layer to layer ({values}), which elelem "
                                  f"supports for Gemma 4 only")
        h[layer_name] = values
    return max(values)


def _rope_scaling(gguf: GGUFFile, prefix: str, key: Callable[[str, Any], Any], n_ctx_train: int) -> dict:
    """RoPE's position scale (1/factor for linear and YaRN scaling, else 1),
    and YaRN's parameters, as llama.cpp derives them (llama-context.cpp).

    The type defaults to linear, and the factor comes from
    rope.scaling.factor or the older rope.scale_linear (0 or absent: no
    scaling).  LongRoPE also changes the rotation's frequencies, which
    elelem does not implement, so it is refused rather than run as if
    unscaled.
    """
    type_key = prefix + "rope.scaling.type"
    kind = gguf.get(type_key, "linear")
    if not isinstance(kind, str):  # an array, say: its == would compare element by element
        raise ModelShapeError(f"{type_key} must be a string, got {type(kind).__name__}")
    if kind not in ("none", "linear", "yarn"):
        raise ModelShapeError(f"{type_key} = {kind!r} is not supported: elelem implements 'none', "
                              f"'linear' and 'yarn' RoPE scaling")
    out = {"rope_scale": 1.0, "rope_ext_factor": 0.0, "rope_attn_factor": 1.0, "yarn_beta_fast": 32.0,
           "yarn_beta_slow": 1.0, "n_ctx_orig": int(key("rope.scaling.original_context_length", n_ctx_train))}
    if not 0 < out["n_ctx_orig"] < 2**31:
        raise ModelShapeError(f"{prefix}rope.scaling.original_context_length = {out['n_ctx_orig']} is out of range")
    name = "rope.scaling.factor" if gguf.get(prefix + "rope.scaling.factor") is not None else "rope.scale_linear"
    factor = float(key(name, 0.0))
    if factor != 0.0 and not (factor > 0 and math.isfinite(factor)):
        raise ModelShapeError(f"{prefix + name} = {factor} must be a positive number")
    if kind != "none" and factor != 0.0:
        out["rope_scale"] = float(np.float32(1.0) / np.float32(factor))
    if kind == "yarn":
        out["yarn_beta_fast"] = float(key("rope.scaling.yarn_beta_fast", 32.0))
        out["yarn_beta_slow"] = float(key("rope.scaling.yarn_beta_slow", 1.0))
        out["rope_ext_factor"] = ext = float(key("rope.scaling.yarn_ext_factor", -1.0))
        if ext < 0:
            out["rope_ext_factor"] = 1.0
        out["rope_attn_factor"] = _yarn_attn_factor(out["rope_scale"], out["rope_ext_factor"],
                                                    float(key("rope.scaling.yarn_log_multiplier", 0.0)))
    out["rope_attn_factor"] = float(np.float32(out["rope_attn_factor"]) *
                                    np.float32(key("rope.scaling.attn_factor", 1.0)))
    return out


def _yarn_attn_factor(freq_scale: float, ext_factor: float, log_mul: float) -> float:
    """llama.cpp's cparams.yarn_attn_factor, in float32 as it computes it:
    the magnitude scale of YaRN, divided by the 1 + 0.1 ln(factor) that
    ggml's rope multiplies in again (llama.cpp#17945)."""
    if ext_factor == 0:
        return 1.0
    f32 = np.float32
    factor = f32(1.0) / f32(freq_scale)

    def mscale(scale, m):  # 0.1 * m * logf(scale) + 1, or 1 for scale <= 1
        return f32(1.0) if scale <= 1.0 else f32(f32(f32(0.1) * f32(m)) * f32(math.log(scale))) + f32(1.0)

    attn = mscale(factor, 1.0) / mscale(factor, log_mul) if log_mul != 0.0 else mscale(factor, 1.0)
    return float(f32(attn) * (f32(1.0) / (f32(1.0) + f32(f32(0.1) * f32(math.log(factor))))))


def _expected_shapes(h: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    e, q, kv_k, kv_v = h["n_embd"], h["n_head"] * h["head_dim_k"], h["n_head_kv"] * h["head_dim_k"], \
        h["n_head_kv"] * h["head_dim_v"]
    shapes = {
        "attn_norm": (e,), "ffn_norm": (e,), "attn_post_norm": (e,), "ffn_post_norm": (e,),
        "wq": (e, q), "wk": (e, kv_k), "wv": (e, kv_v), "wo": (h["n_head"] * h["head_dim_v"], e),
        "bq": (q,), "bk": (kv_k,), "bv": (kv_v,), "bo": (e,),
        "q_norm": (h["head_dim_k"],), "k_norm": (h["head_dim_k"],),
        "ffn_gate": (e, h["n_ff"]), "ffn_up": (e, h["n_ff"]), "ffn_down": (h["n_ff"], e),
        "tok_embd": (e, h["n_vocab"]), "output": (e, h["n_vocab"]), "output_norm": (e,),
        "rope_freqs": (h.get("rope_freqs_dims", h["n_rot"]) // 2,),
        "wqkv": (e, q + kv_k + kv_v), "bqkv": (q + kv_k + kv_v,),
        "attn_out_norm": (e,), "attn_out_norm_b": (e,), "layer_out_norm": (e,), "layer_out_norm_b": (e,),
        "ffn_up_b": (h["n_ff"],), "ffn_down_b": (e,),
        "attn_sinks": (h["n_head"],),
        "pos_embd": (e, h["n_ctx_train"]), "type_embd": (e, h.get("n_token_types", 0)),
        "tok_norm": (e,), "tok_norm_b": (e,),
        "ffn_pre_norm_2": (e,), "ffn_post_norm_1": (e,), "ffn_post_norm_2": (e,), "layer_out_scale": (1,),
        "ffn_gate_inp_s": (e,),
    }
    if h.get("q_gate"):     # Q's projection also writes the output gate, head by head
        shapes["wq"] = (e, 2 * q)
    if "ssm_d_inner" in h:
        key_dim = h["ssm_d_state"] * h["ssm_n_group"]
        conv_dim = 2 * key_dim + h["ssm_d_inner"]
        shapes.update({
            "wqkv": (e, conv_dim), "attn_gate": (e, h["ssm_d_inner"]), "ssm_conv1d": (h["ssm_d_conv"], conv_dim),
            "ssm_dt": (h["ssm_dt_rank"],), "ssm_a": (h["ssm_dt_rank"],), "ssm_beta": (e, h["ssm_dt_rank"]),
            "ssm_alpha": (e, h["ssm_dt_rank"]), "ssm_norm": (h["ssm_d_state"],), "ssm_out": (h["ssm_d_inner"], e),
            "ssm_in": (e, conv_dim + h["ssm_d_inner"]), "ssm_ba": (e, 2 * h["ssm_dt_rank"]),
        })
    n_pl = h.get("n_embd_per_layer", 0)
    if n_pl:
        shapes.update({
            "per_layer_inp_gate": (e, n_pl), "per_layer_proj": (n_pl, e), "per_layer_post_norm": (e,),
            "per_layer_tok_embd": (n_pl * h["n_layer"], h["n_vocab"]),
            "per_layer_model_proj": (e, n_pl * h["n_layer"]), "per_layer_proj_norm": (n_pl,),
        })
    if "n_expert" in h:
        x, f, fs = h["n_expert"], h["n_ff_exp"], h["n_ff_shexp"]
        shapes.update({
            "ffn_gate_inp": (e, x), "ffn_gate_inp_b": (x,), "ffn_exp_probs_b": (x,),
            "ffn_gate_exps": (e, f, x), "ffn_up_exps": (e, f, x), "ffn_down_exps": (f, e, x),
            "ffn_gate_exps_b": (f, x), "ffn_up_exps_b": (f, x), "ffn_down_exps_b": (e, x),
            "ffn_gate_shexp": (e, fs), "ffn_up_shexp": (e, fs), "ffn_down_shexp": (fs, e),
            "ffn_gate_inp_shexp": (e,),
            "ffn_gate_up_exps": (e, 2 * f, x), "ffn_down_exps_s": (x,),
        })
    return shapes


# Per-layer hparams lists (Gemma 4) -> the hparam each gives a layer its value of.
_LAYER_HPARAMS = {"layer_n_head_kv": "n_head_kv", "layer_head_dim_k": "head_dim_k",
                  "layer_head_dim_v": "head_dim_v", "layer_n_ff": "n_ff"}


def _layer_shapes(h: Mapping[str, Any], shapes: dict, i: int) -> dict:
    """The expected shapes for layer ``i``: ``shapes``, or where some
    hyperparameters differ from layer to layer, those of the layer's own."""
    own = {name: h[lists][i] for lists, name in _LAYER_HPARAMS.items() if lists in h and h[lists][i] != h[name]}
    return _expected_shapes(dict(h, **own)) if own else shapes


def _check_shape(gguf: GGUFFile, role: str, name: str, want: tuple[int, ...]) -> None:
    info = gguf.tensors[name]
    # The token-type table is added as a vector (its row 0), so it is F32 too.
    allowed = _VECTOR_TYPES if len(want) == 1 or role in _F32_MATRIX_ROLES else _MATRIX_TYPES
    if info.type_name not in allowed:
        raise ModelShapeError(f"tensor {name!r} ({role}) has type {info.type_name}, which elelem cannot "
                              f"compute with here; expected one of {', '.join(sorted(allowed))}")
    got = tuple(info.shape)
    # A trailing dimension of 1 is the same shape to ggml.
    while len(got) > len(want) and got[-1] == 1:
        got = got[:-1]
    if got != want:
        raise ModelShapeError(f"tensor {name!r} ({role}) has shape {list(got)}, expected {list(want)}")


def _tensor_tables(gguf: GGUFFile, arch: Architecture, h: dict[str, Any]):
    shapes = _expected_shapes(h)
    globals_: dict[str, Optional[str]] = {role: None for role in GLOBAL_TENSOR_NAMES}
    for role in arch.global_required + arch.global_optional:
        name = GLOBAL_TENSOR_NAMES[role]
        present = name in gguf.tensors
        if not present and role in arch.global_required:
            raise ModelShapeError(f"required tensor {name!r} is missing")
        if present:
            _check_shape(gguf, role, name, shapes[role])
        globals_[role] = name if present else None  # output absent: tied to tok_embd

    layers = []
    for i in range(h["n_layer"]):
        table: dict[str, Optional[str]] = {}
        layer_shapes = _layer_shapes(h, shapes, i)
        required, optional = _layer_roles(arch, h, i, gguf.tensors)
        for role in required + optional:
            name = arch.tensor_names.get(role, LAYER_TENSOR_NAMES[role]).format(i=i)
            if name not in gguf.tensors:
                if role in required:
                    raise ModelShapeError(f"required tensor {name!r} is missing")
                continue
            _check_shape(gguf, role, name, layer_shapes[role])
            table[role] = name
        if "wk" in table and (("bq" in table) != ("bk" in table) or ("q_norm" in table) != ("k_norm" in table)):
            raise ModelShapeError(f"layer {i}: Q and K must both have, or both lack, biases and norms")
        if arch.encoder:
            _check_encoder_projections(i, table)
        layers.append(table)
    return globals_, layers


def _layer_roles(arch: Architecture, h: Mapping[str, Any], i: int,
                 tensors: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The roles layer ``i`` must have and may have: an expert layer's FFN is
    the router and the experts (and shared experts where the model has them),
    a leading dense layer's the plain gated FFN; or what the architecture's
    own ``layer_roles`` says."""
    if arch.layer_roles is not None:
        return arch.layer_roles(h, i, tensors)
    required, optional = (arch.recurrent, ()) if arch.recurrent and h["recurrent_layers"][i] else \
        (arch.required, arch.optional)
    if required is arch.recurrent:
        for fused, parts in arch.recurrent_fused.items():
            separate = all(LAYER_TENSOR_NAMES[r].format(i=i) in tensors for r in parts)
            if not separate and LAYER_TENSOR_NAMES[fused].format(i=i) in tensors:
                required = tuple(r for r in required if r not in parts) + (fused,)
    experts = arch.experts
    if experts is None:
        return required, optional
    if i < h["n_layer_dense_lead"]:
        return required + _DENSE_FFN, optional
    shared = _SHARED_EXPERTS if h["n_expert_shared"] > 0 else ()
    return required + experts.required + shared, optional + experts.optional


def _check_encoder_projections(i: int, table: dict[str, Optional[str]]) -> None:
    """An encoder layer projects Q, K and V separately or through one fused
    matrix (nomic-bert), never both, and its biases go with its matrices."""
    separate = [r for r in ("wq", "wk", "wv") if r in table]
    if "wqkv" in table:
        stray = separate + [r for r in ("bq", "bk", "bv") if r in table]
        if stray:
            raise ModelShapeError(f"layer {i} has a fused attn_qkv and also {', '.join(stray)}")
    elif len(separate) != 3:
        raise ModelShapeError(f"layer {i} needs attn_q, attn_k and attn_v (or a fused attn_qkv)")
    elif "bqkv" in table or ("bq" in table) != ("bv" in table):
        raise ModelShapeError(f"layer {i}: Q, K and V must all have, or all lack, biases")
