"""The hyperparameters every decoder has, and the helpers architecture
modules read theirs with.

Each :class:`HParam` is declared once, with its default: the native
``HParams`` struct and the code that fills it are generated from these
declarations (:mod:`elelem.model.archs._codegen`), and a model's hyperparameters are checked
against them (:func:`check_hparams`).  Hyperparameters the core reads by
name, or not at all, are declared here as well, with a kind the struct has
no field for.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

from ...errors import ModelShapeError
from .spec import KINDS, REQUIRED, HParam, SameAs

# Bounds that keep every count a C int and every loop over layers short,
# checked before anything is sized from them.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 20

Key = Callable[..., Any]

HPARAMS = (
    HParam("n_vocab", "int", REQUIRED, "token_embd's height"),
    HParam("n_embd", "int", REQUIRED, "embedding_length"),
    HParam("n_layer", "int", REQUIRED, "block_count, less any multi-token-prediction layers"),
    HParam("n_head", "int", REQUIRED, "attention.head_count"),
    HParam("n_head_kv", "int", REQUIRED, "the largest layer's, where they differ (layer_n_head_kv)"),
    HParam("head_dim_k", "int", REQUIRED, "per-head width of Q and K"),
    HParam("head_dim_v", "int", REQUIRED, "per-head width of V"),
    HParam("n_ff", "int", REQUIRED, "feed_forward_length (the largest, where it differs per layer)"),
    HParam("n_ctx_train", "int", REQUIRED, "context_length"),
    HParam("n_rot", "int", REQUIRED, "rotated dims of each head"),
    HParam("rope_type", "str", REQUIRED, "GGML_ROPE_TYPE_NORMAL, _NEOX, _MROPE or _IMROPE",
           native_values={"normal": "GGML_ROPE_TYPE_NORMAL", "neox": "GGML_ROPE_TYPE_NEOX",
                          "mrope": "GGML_ROPE_TYPE_MROPE", "imrope": "GGML_ROPE_TYPE_IMROPE"}),
    HParam("rms_eps", "float", REQUIRED, "RMSNorm's epsilon"),
    HParam("rope_base", "float", REQUIRED, "global layers"),
    HParam("rope_base_swa", "float", SameAs("rope_base"), "sliding-window layers"),
    HParam("rope_scale", "float", 1.0, "freq_scale = 1 / linear scaling factor"),
    HParam("rope_scale_swa", "float", SameAs("rope_scale"),
           "the same for sliding-window layers (gemma3: never scaled, as llama.cpp)"),
    HParam("attn_scale", "float", REQUIRED, "multiplies Q.K"),
    HParam("embd_scale", "float", 1.0, "multiplies the token embeddings (1 for most)"),
    HParam("n_swa", "int", 0, "sliding window width, 0 if none"),
    HParam("norm_eps", "float", 1e-12, "LayerNorm's epsilon (BERT)"),
    HParam("causal", "bool", True, "a token sees only earlier positions; else its whole sequence (BERT's default)"),
    HParam("encoder", "bool", False, "no output head: the output is the last hidden state (BERT family)"),
    # RoPE scaling beyond linear (YaRN), as ggml_rope_ext takes it
    HParam("n_ctx_orig", "int", SameAs("n_ctx_train"),
           "the context YaRN extends (rope.scaling.original_context_length; n_ctx_train)"),
    HParam("rope_ext_factor", "float", 0.0, "0 without YaRN"),
    HParam("rope_attn_factor", "float", 1.0, "YaRN's magnitude scale"),
    HParam("yarn_beta_fast", "float", 32.0, "YaRN's ramp"),
    HParam("yarn_beta_slow", "float", 1.0, "YaRN's ramp"),
    # Attention temperature (mistral3): Q *= 1 + attn_temp_scale * log(floor(pos / attn_temp_floor) + 1)
    HParam("attn_temp_scale", "float", 0.0, "0: none"),
    HParam("attn_temp_floor", "int", 1, "positions per step of the temperature"),
    HParam("late_output_rows", "bool", False,
           "the unwanted rows dropped after the last layer, not before its FFN (gpt-oss, qwen35)"),
    HParam("rope_sections", "int[4]", (0, 0, 0, 0), "multi-section RoPE (mrope, imrope): rotated dims per position stream"),
    HParam("q_gate", "bool", False, "the full-attention Q projection also writes a sigmoid output gate (qwen35)"),
    # Read by the core by name: one value per layer
    HParam("swa_layers", "bools", None, "1 where the layer attends over the sliding window"),
    HParam("recurrent_layers", "bools", None, "1 for a recurrent layer (Gated DeltaNet, LFM2's short convolution)"),
    HParam("layer_n_head", "ints", None, "each layer's heads, where they differ (Laguna)"),
    HParam("layer_n_head_kv", "ints", None, "each layer's KV heads, where they differ (Gemma 4)"),
    HParam("layer_head_dim_k", "ints", None, "each layer's K width, where they differ"),
    HParam("layer_head_dim_v", "ints", None, "each layer's V width, where they differ"),
    HParam("layer_n_rot", "ints", None, "each layer's rotated dims, where they differ"),
    HParam("layer_n_ff", "ints", None, "each layer's FFN width, where they differ"),
    HParam("layer_kv_source", "ints", None, "the layer whose K/V each layer attends over (Gemma 4)"),
    # Read by the checks only
    HParam("n_layer_nextn", "int", 0, "multi-token-prediction layers after the model's, skipped",
           core=False),
    HParam("rope_freqs_dims", "int", SameAs("n_rot"), "the head width rope_freqs has factors for", core=False),
)


def check_hparams(h: Mapping[str, Any], declared: Mapping[str, HParam]) -> None:
    """Every hyperparameter an architecture's reading set is declared, and of its declared kind."""
    for name, value in h.items():
        decl = declared.get(name)
        if decl is None:
            raise TypeError(f"hyperparameter {name!r} is set but declared by no architecture module")
        want = KINDS[decl.kind][0]
        ok = isinstance(value, want) and (want is not int or not isinstance(value, bool))
        if want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise TypeError(f"hyperparameter {name!r} = {value!r} is not of its declared kind {decl.kind}")
    for decl in declared.values():
        if decl.default is REQUIRED and decl.name not in h:
            raise TypeError(f"hyperparameter {decl.name!r} has no default and was not set")


def key_reader(gguf: Any, prefix: str) -> Key:
    """key(name, default): the number ``prefix + name`` of the file, or
    ``default``; missing with no default, or not a finite number, is a
    ModelShapeError naming the key."""
    def key(name: str, default: Any = None) -> Any:
        value = gguf.get(prefix + name, default)
        if value is None:
            raise ModelShapeError(f"missing hyperparameter {prefix + name}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not math.isfinite(value)):
            raise ModelShapeError(f"{prefix + name} = {value!r} must be a finite number")
        return value
    return key


def flag(gguf: Any, key: str, default: bool) -> bool:
    value = gguf.get(key, default)
    if not isinstance(value, bool):
        raise ModelShapeError(f"{key} = {value!r} must be a boolean")
    return value


def array(value: Any) -> Optional[list]:
    """A GGUF array as a list (the reader gives numeric ones as numpy arrays), else None."""
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim == 1 else None
    return list(value) if isinstance(value, list) else None


def int_list(value: Any) -> Optional[list[int]]:
    """An integer (or boolean) array of the file as a list of ints, or None if it is not one."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iub":
        return [int(x) for x in value]
    if isinstance(value, list) and all(isinstance(x, (bool, int, np.integer)) for x in value):
        return [int(x) for x in value]
    return None


def per_layer_key(h: dict, gguf: Any, arch_name: str, per_layer_shapes: bool, key: Key, name: str,
                  layer_name: str, default: Any) -> int:
    """A hyperparameter llama.cpp reads as one number or one per layer
    (get_key_or_arr): the number, or for an array of equal values that value.
    An array of differing values is kept as ``h[layer_name]`` where the
    architecture has per-layer shapes (Gemma 4, Laguna's head counts; the
    number returned is then the largest), and refused elsewhere."""
    full = array(gguf.get(arch_name + "." + name))
    if full is None:
        return int(key(name, default))
    n = h["n_layer"]
    if len(full) < n or not all(isinstance(v, int) and not isinstance(v, bool) for v in full):
        raise ModelShapeError(f"{arch_name}.{name} must be a number or an integer per layer ({n} layers)")
    values = [int(v) for v in full[:n]]
    if any(not 0 < v < 2**31 for v in values):
        raise ModelShapeError(f"{arch_name}.{name} = {values} is out of range")
    if len(set(values)) > 1:
        if not per_layer_shapes:
            raise ModelShapeError(f"{arch_name}.{name} differs from layer to layer ({values}), which elelem "
                                  f"does not support for {arch_name}")
        h[layer_name] = values
    return max(values)


def rope_scaling(gguf: Any, prefix: str, key: Key, n_ctx_train: int) -> dict:
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
        with np.errstate(over="ignore"):
            out["rope_scale"] = float(np.float32(1.0) / np.float32(factor))
        if not (math.isfinite(out["rope_scale"]) and out["rope_scale"] > 0):   # a factor below float32's range
            raise ModelShapeError(f"{prefix + name} = {factor} is out of float32's range for a RoPE scale")
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


def require_rope_over_whole_heads(h: dict, arch_name: str) -> None:
    """K and V heads of one width, all of it rotated: what the graphs of
    llama.cpp that assert n_embd_head_k == n_embd_head_v == n_rot need (a
    file otherwise is refused there with an abort, here with this error)."""
    if not h["head_dim_k"] == h["head_dim_v"] == h["n_rot"]:
        raise ModelShapeError(f"{arch_name}: attention.key_length = {h['head_dim_k']}, attention.value_length = "
                              f"{h['head_dim_v']} and rope.dimension_count = {h['n_rot']} must be equal")


def nextn(h: dict, key: Key, gguf: Any) -> None:
    # Multi-token-prediction (NextN) blocks are counted in block_count but
    # come after the model's layers; llama.cpp's main graph skips them, and
    # so does elelem (their weights stay mapped, never read).
    count = int(key("nextn_predict_layers", 0))
    if not 0 <= count < h["n_layer"]:
        raise ModelShapeError(f"nextn_predict_layers = {count} must be below block_count = {h['n_layer']}")
    h["n_layer_nextn"] = count
    h["n_layer"] -= count


def swa_pattern(h: dict, key: Key, gguf: Any, default: int, dense_first: bool = False) -> None:
    """Which layers attend over the sliding window, as llama.cpp's
    set_swa_pattern: every layer but each ``pattern``-th, the last of each
    ``pattern`` layers, or with ``dense_first`` the first (an array in the
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
    if dense_first:
        h["swa_layers"] = [pattern == 0 or il % pattern != 0 for il in range(h["n_layer"])]
    else:
        h["swa_layers"] = [pattern == 0 or il % pattern < pattern - 1 for il in range(h["n_layer"])]


def ssm_widths(h: dict, key: Key, prefix: str) -> None:
    """The state-space layers' widths (``ssm.*``: Gated DeltaNet's and Mamba-2's
    share the keys), each in range, the convolution 2..64 wide."""
    for name, k in (("ssm_d_conv", "ssm.conv_kernel"), ("ssm_d_inner", "ssm.inner_size"),
                    ("ssm_d_state", "ssm.state_size"), ("ssm_n_group", "ssm.group_count"),
                    ("ssm_dt_rank", "ssm.time_step_rank")):
        h[name] = int(key(k))
        if not 0 < h[name] <= MAX_WIDTH:
            raise ModelShapeError(f"{prefix}{k} = {h[name]} is out of range")
    if not 2 <= h["ssm_d_conv"] <= 64:
        raise ModelShapeError(f"{prefix}ssm.conv_kernel = {h['ssm_d_conv']} must be in 2..64")
