"""Tiny random projector files (mmproj GGUFs, general.architecture "clip"),
written with the `gguf` package in the layout llama.cpp's converter writes
(conversion/base.py's MmprojModel, conversion/gemma.py's Gemma3VisionModel and
Gemma4VisionAudioModel), and a NumPy reference of the gemma3 encoder.

Imported by the DEV-ONLY generator run under the llama.cpp reference (it needs
only `gguf` and NumPy) and by the tests.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

import ggml_numerics as numerics

QWEN_TYPES = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")


@dataclass(frozen=True)
class TinyProjector:
    projector_type: str = "gemma3"
    n_embd: int = 32
    n_head: int = 4
    n_ff: int = 64
    n_layer: int = 2
    image_size: int = 32
    patch_size: int = 4
    n_merge: int = 2                  # written as projector.scale_factor (the real models' 4 is not written)
    n_embd_out: int = 64              # the text model's width (projection_dim)
    eps: float = 1e-6
    wtype: str = "f16"                # the converter's --outtype f16: matmul weights F16, the rest F32
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    seed: int = 0
    # Broken files, for the tests of bad input: tensors left out, tensors cut to a length along
    # an axis (numpy order), keys left out, and keys written with other values.
    drop: tuple = ()
    cut: tuple = ()
    drop_keys: tuple = ()
    keys: tuple = ()                  # ((key, value), ...) overriding or adding keys
    n_wa_pattern: int = 2             # qwen25vl: every 2nd layer attends fully, the others in windows
    # gemma4v: the rows of each position table, and the clippable linears' bounds written
    # ((weight stem, suffix, value), ...): e.g. ("v.blk.0.ffn_down", "output_max", 0.5)
    pos_size: int = 64
    clamps: tuple = ()
    mm_bias: bool = True              # pixtral: the adapter's linears have biases (pixtral-12b; Mistral Small 3.1's none)
    # qwen3vl: the layers with a deepstack merger (deepstack_visual_indexes)
    deepstack: tuple = (0, 2)
    longest_edge: int = 80            # idefics3: the preprocessor's longest edge (clip.vision.preproc_image_size)

    @property
    def side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        """Embeddings per encoded square (an idefics3 image has several squares)."""
        return (self.side // self.n_merge) ** 2

    def but(self, **kw) -> "TinyProjector":
        return replace(self, **kw)


def make_weights(cfg: TinyProjector) -> dict[str, np.ndarray]:
    """name -> float32 weights in numpy order (the reverse of ggml's)."""
    if cfg.projector_type == "gemma4v":
        return _gemma4v_weights(cfg)
    if cfg.projector_type == "pixtral":
        return _pixtral_weights(cfg)
    rng = np.random.default_rng(cfg.seed)
    e, f = cfg.n_embd, cfg.n_ff

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def vec(n, scale=0.1):
        return (rng.standard_normal(n) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    if cfg.projector_type in QWEN_TYPES:
        return _qwen_weights(cfg, rng, mat, vec, norm)
    p = cfg.patch_size
    w = {
        "v.patch_embd.weight": (rng.standard_normal((e, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32),
        "v.patch_embd.bias": vec(e),
        "v.position_embd.weight": (rng.standard_normal((cfg.side * cfg.side, e)) * 0.5).astype(np.float32),
    }
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        w.update({
            b + "ln1.weight": norm(e), b + "ln1.bias": vec(e),
            b + "attn_q.weight": mat(e, e), b + "attn_q.bias": vec(e),
            b + "attn_k.weight": mat(e, e), b + "attn_k.bias": vec(e),
            b + "attn_v.weight": mat(e, e), b + "attn_v.bias": vec(e),
            b + "attn_out.weight": mat(e, e), b + "attn_out.bias": vec(e),
            b + "ln2.weight": norm(e), b + "ln2.bias": vec(e),
            b + "ffn_up.weight": mat(f, e), b + "ffn_up.bias": vec(f),
            b + "ffn_down.weight": mat(e, f), b + "ffn_down.bias": vec(e),
        })
    w["v.post_ln.weight"] = norm(e)
    w["v.post_ln.bias"] = vec(e)
    if cfg.projector_type == "lfm2":
        # Lfm2VlMultiModalProjector: a LayerNorm over the unshuffled rows, linear_1, GELU, linear_2.
        k2 = cfg.n_merge * cfg.n_merge
        w.update({"mm.input_norm.weight": norm(e * k2), "mm.input_norm.bias": vec(e * k2),
                  "mm.1.weight": mat(cfg.n_ff, e * k2), "mm.1.bias": vec(cfg.n_ff),
                  "mm.2.weight": mat(cfg.n_embd_out, cfg.n_ff), "mm.2.bias": vec(cfg.n_embd_out)})
        return w
    if cfg.projector_type == "idefics3":
        # Idefics3Connector's modality_projection.proj: (text width, n_embd * scale_factor^2), no bias.
        k2 = cfg.n_merge * cfg.n_merge
        w["mm.model.fc.weight"] = (rng.standard_normal((cfg.n_embd_out, e * k2)) / np.sqrt(e * k2)).astype(np.float32)
        return w
    # Gemma3MultiModalProjector.mm_input_projection_weight is (vision width, text width); the
    # converter adds 1 to soft_emb_norm (Gemma's RMSNorm scales by 1 + w).
    w["mm.input_projection.weight"] = (rng.standard_normal((e, cfg.n_embd_out)) / np.sqrt(e)).astype(np.float32)
    w["mm.soft_emb_norm.weight"] = norm(e)
    return w


def _qwen_weights(cfg: TinyProjector, rng, mat, vec, norm) -> dict[str, np.ndarray]:
    """Qwen2VLVisionModel's layout: the Conv3D kernel's two temporal slices, Q/K/V split
    from qkv, no positions table; 2.5 adds a gate and RMSNorms (no norm biases)."""
    e, f, p = cfg.n_embd, cfg.n_ff, cfg.patch_size
    rms = cfg.projector_type == "qwen2.5vl_merger"
    qwen3 = cfg.projector_type == "qwen3vl_merger"
    w = {}
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        w[name] = (rng.standard_normal((e, 3, p, p)) / np.sqrt(6 * p * p)).astype(np.float32)
    if qwen3:   # Qwen3VLVisionModel: the patch bias kept, num_position_embeddings learned positions
        w["v.patch_embd.bias"] = vec(e)
        w["v.position_embd.weight"] = (rng.standard_normal((cfg.side * cfg.side, e)) * 0.5).astype(np.float32)
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        w.update({b + "ln1.weight": norm(e), b + "ln2.weight": norm(e)})
        if not rms:
            w.update({b + "ln1.bias": vec(e), b + "ln2.bias": vec(e)})
        if qwen3:   # attn.qkv kept whole
            w[b + "attn_qkv.weight"], w[b + "attn_qkv.bias"] = mat(3 * e, e), vec(3 * e)
        for n in ("" if qwen3 else "qkv"):
            w[b + f"attn_{n}.weight"], w[b + f"attn_{n}.bias"] = mat(e, e), vec(e)
        w[b + "attn_out.weight"], w[b + "attn_out.bias"] = mat(e, e), vec(e)
        w[b + "ffn_up.weight"], w[b + "ffn_up.bias"] = mat(f, e), vec(f)
        if rms:
            w[b + "ffn_gate.weight"], w[b + "ffn_gate.bias"] = mat(f, e), vec(f)
        w[b + "ffn_down.weight"], w[b + "ffn_down.bias"] = mat(e, f), vec(e)
    w["v.post_ln.weight"] = norm(e)          # merger.ln_q
    if not rms:
        w["v.post_ln.bias"] = vec(e)
    w["mm.0.weight"], w["mm.0.bias"] = mat(4 * e, 4 * e), vec(4 * e)
    w["mm.2.weight"], w["mm.2.bias"] = mat(cfg.n_embd_out, 4 * e), vec(cfg.n_embd_out)
    if qwen3:   # deepstack_merger_list.k -> v.deepstack.<its layer>: a LayerNorm over the merged block, fc1, fc2
        for il in cfg.deepstack:
            b = f"v.deepstack.{il}."
            w[b + "norm.weight"], w[b + "norm.bias"] = norm(4 * e), vec(4 * e)
            w[b + "fc1.weight"], w[b + "fc1.bias"] = mat(4 * e, 4 * e), vec(4 * e)
            w[b + "fc2.weight"], w[b + "fc2.bias"] = mat(cfg.n_embd_out, 4 * e), vec(cfg.n_embd_out)
    return w


def _gemma4v_weights(cfg: TinyProjector) -> dict[str, np.ndarray]:
    """Gemma4VisionAudioModel's vision tensors: the patch kernel permuted to (n_embd, 3, p, p),
    the position tables (2, pos_size, n_embd), RMSNorm weights without biases, per-head Q/K
    norms, norms after the attention and the FFN, a one-value layer scalar, and the
    clippable linears' scalar bounds (made 1-D by the converter)."""
    rng = np.random.default_rng(cfg.seed)
    e, f, p = cfg.n_embd, cfg.n_ff, cfg.patch_size
    hd = e // cfg.n_head

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    w = {
        "v.patch_embd.weight": (rng.standard_normal((e, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32),
        "v.position_embd.weight": (rng.standard_normal((2, cfg.pos_size, e)) * 0.5).astype(np.float32),
    }
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        w.update({
            b + "ln1.weight": norm(e),
            b + "attn_q.weight": mat(e, e), b + "attn_k.weight": mat(e, e), b + "attn_v.weight": mat(e, e),
            b + "attn_q_norm.weight": norm(hd), b + "attn_k_norm.weight": norm(hd),
            b + "attn_out.weight": mat(e, e), b + "attn_post_norm.weight": norm(e),
            b + "ln2.weight": norm(e),
            b + "ffn_gate.weight": mat(f, e), b + "ffn_up.weight": mat(f, e), b + "ffn_down.weight": mat(e, f),
            b + "ffn_post_norm.weight": norm(e),
            b + "out_scale.weight": (0.5 + rng.uniform(0, 1, 1)).astype(np.float32),
        })
    w["v.std_bias"] = (rng.standard_normal(e) * 0.1).astype(np.float32)
    w["v.std_scale"] = norm(e)
    w["mm.input_projection.weight"] = mat(cfg.n_embd_out, e)
    for stem, suffix, value in cfg.clamps:
        w[f"{stem}.{suffix}"] = np.array([value], dtype=np.float32)
    return w


def _pixtral_weights(cfg: TinyProjector) -> dict[str, np.ndarray]:
    """LlavaVisionModel's pixtral layout: a patch kernel without bias, ln_pre as v.pre_ln,
    RMSNorm weights without biases, Q/K/V/O and the gated FFN without biases, the adapter
    as mm.1 / mm.2, the [IMG_BREAK] row of the text embeddings, and where n_merge > 1
    (Mistral Small 3.1) the merger's norm and its (n_embd, n_embd * k * k) projection."""
    rng = np.random.default_rng(cfg.seed)
    e, f, p, n_out, k = cfg.n_embd, cfg.n_ff, cfg.patch_size, cfg.n_embd_out, cfg.n_merge

    def mat(n_out_, n_in):
        return (rng.standard_normal((n_out_, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    w = {
        "v.patch_embd.weight": (rng.standard_normal((e, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32),
        "v.pre_ln.weight": norm(e),
    }
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        w.update({
            b + "ln1.weight": norm(e),
            b + "attn_q.weight": mat(e, e), b + "attn_k.weight": mat(e, e), b + "attn_v.weight": mat(e, e),
            b + "attn_out.weight": mat(e, e),
            b + "ln2.weight": norm(e),
            b + "ffn_gate.weight": mat(f, e), b + "ffn_up.weight": mat(f, e), b + "ffn_down.weight": mat(e, f),
        })
    if k > 1:
        w["mm.input_norm.weight"] = norm(e)
        w["mm.patch_merger.weight"] = mat(e, e * k * k)
    w["mm.1.weight"], w["mm.2.weight"] = mat(n_out, e), mat(n_out, n_out)
    if cfg.mm_bias:
        w["mm.1.bias"] = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
        w["mm.2.bias"] = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
    w["v.token_embd.img_break"] = (rng.standard_normal(n_out) * 0.5).astype(np.float32)
    return w


def tensor_type(cfg: TinyProjector, name: str, arr: np.ndarray) -> str:
    """Gemma3VisionModel.tensor_force_quant: the input projection F16, the embeddings
    (patch and position) F32; other matmul weights the output type, vectors F32."""
    if cfg.projector_type == "pixtral":
        return "f32" if arr.ndim < 2 else cfg.wtype
    if cfg.projector_type == "gemma4v":
        # MmprojModel.tensor_force_quant: the patch kernel the output type; the position tables F32.
        return "f32" if arr.ndim < 2 or name == "v.position_embd.weight" else cfg.wtype
    if name == "mm.input_projection.weight":
        return "f16"
    if cfg.projector_type == "lfm2":
        # MmprojModel: the patch kernel the output type, the position table (V_ENC_EMBD_POS) F32.
        return "f32" if arr.ndim < 2 or name == "v.position_embd.weight" else cfg.wtype
    if cfg.projector_type in QWEN_TYPES and name.startswith("v.patch_embd.weight"):
        return cfg.wtype   # MmprojModel.tensor_force_quant: the patch kernel F16 in an F16 file
    if name.startswith(("v.patch_embd", "v.position_embd")) or arr.ndim < 2:
        return "f32"
    return cfg.wtype


def write_projector(path: Path, cfg: TinyProjector = TinyProjector()) -> dict[str, np.ndarray]:
    """Write ``cfg`` to ``path``; returns the weights as stored (float32, F16 ones rounded)."""
    weights = make_weights(cfg)
    for name in cfg.drop:
        del weights[name]
    for name, axis, length in cfg.cut:
        weights[name] = np.ascontiguousarray(np.take(weights[name], range(length), axis=axis))
    writer = gguf.GGUFWriter(str(path), "clip")
    keys = {
        "general.type": "mmproj",
        "general.file_type": 1 if cfg.wtype == "f16" else 0,
        "clip.has_vision_encoder": True,
        "clip.vision.projection_dim": cfg.n_embd_out,
        "clip.vision.image_size": cfg.image_size,
        "clip.vision.patch_size": cfg.patch_size,
        "clip.vision.embedding_length": cfg.n_embd,
        "clip.vision.feed_forward_length": cfg.n_ff,
        "clip.vision.block_count": cfg.n_layer,
        "clip.vision.attention.head_count": cfg.n_head,
        "clip.vision.image_mean": list(cfg.image_mean),
        "clip.vision.image_std": list(cfg.image_std),
        "clip.projector_type": cfg.projector_type,
        "clip.vision.attention.layer_norm_epsilon": cfg.eps,
        "clip.use_gelu": True,
    }
    if cfg.projector_type in QWEN_TYPES:
        # Qwen2VLVisionModel.set_gguf_parameters: no merge key (2 is clip.cpp's default), no GELU flag
        # (quick GELU); Qwen2-VL's feed_forward_length is the text width (config's hidden_size).
        del keys["clip.use_gelu"]
        if cfg.projector_type == "qwen3vl_merger":
            # Qwen3VLVisionModel.set_gguf_parameters: GELU, the merge size, the text model's RMSNorm epsilon
            # for the vision norms, and a flag per layer for the deepstack layers.
            keys["clip.use_gelu"] = True
            keys["clip.vision.spatial_merge_size"] = 2
            keys["clip.vision.is_deepstack_layers"] = [il in cfg.deepstack for il in range(cfg.n_layer)]
        elif cfg.projector_type == "qwen2.5vl_merger":
            keys["clip.use_silu"] = True
            keys["clip.vision.n_wa_pattern"] = cfg.n_wa_pattern
        else:
            keys["clip.vision.feed_forward_length"] = cfg.n_embd_out
        keys["clip.vision.image_mean"] = [0.48145466, 0.4578275, 0.40821073]
        keys["clip.vision.image_std"] = [0.26862954, 0.26130258, 0.27577711]
    elif cfg.projector_type == "gemma4v":
        # Gemma4VisionAudioModel: the type under clip.vision. (a mixed-modality file), image_size 224
        # ("unused"), no use_gelu (clip.cpp then takes quick GELU), no scale factor (3).
        del keys["clip.projector_type"], keys["clip.use_gelu"]
        keys["clip.vision.projector_type"] = "gemma4v"
        if cfg.n_merge != 3:
            keys["clip.vision.projector.scale_factor"] = cfg.n_merge
    elif cfg.projector_type == "pixtral":
        # LlavaVisionModel.set_gguf_parameters: SiLU, Mistral's mean and std, the RoPE base
        # (clip.cpp takes 10000 whatever it says), spatial_merge_size only where patches merge.
        del keys["clip.use_gelu"]
        keys["clip.use_silu"] = True
        keys["clip.rope.freq_base"] = 10000.0
        keys["clip.vision.image_mean"] = [0.48145466, 0.4578275, 0.40821073]
        keys["clip.vision.image_std"] = [0.26862954, 0.26130258, 0.27577711]
        if cfg.n_merge > 1:
            keys["clip.vision.spatial_merge_size"] = cfg.n_merge
    elif cfg.projector_type == "lfm2":
        # LFM2VLModel.set_gguf_parameters: image_size 256 ("for compatibility"), the downsample factor.
        keys["clip.vision.projector.scale_factor"] = cfg.n_merge
    elif cfg.projector_type == "idefics3":
        # SmolVLMModel.set_gguf_parameters: the scale factor and the longest edge always written.
        keys["clip.vision.projector.scale_factor"] = cfg.n_merge
        keys["clip.vision.preproc_image_size"] = cfg.longest_edge
    elif cfg.n_merge != 4:
        keys["clip.vision.projector.scale_factor"] = cfg.n_merge
    keys.update(dict(cfg.keys))
    for key in cfg.drop_keys:
        keys.pop(key, None)
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif all(isinstance(v, bool) for v in value):
            writer.add_array(key, list(value))
        else:
            writer.add_array(key, [float(v) for v in value])
    stored = {}
    for name, arr in weights.items():
        if tensor_type(cfg, name, arr) == "f16":
            arr = arr.astype(np.float16)
        writer.add_tensor(name, arr)
        stored[name] = arr.astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def _layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _linear(x, w, wtype):
    """x @ w.T as ggml's matmul rounds it: F16 weights take F16 activations."""
    return numerics.matmul(x, w, wtype)


def siglip_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray) -> np.ndarray:
    """The SigLIP encoder's output (post-norm) for ``pixels`` (3, H, W), patches row by row,
    in float64 but for ggml's F16 roundings (matmul activations for F16 weights, the GELU
    table): (n_patches, n_embd)."""
    p, s, e = cfg.patch_size, cfg.side, cfg.n_embd
    pixels = pixels[:, :s * p, :s * p]   # the pixels past the last whole patch are never read (SmolVLM2's 384 / 14)
    x = pixels.astype(np.float64).reshape(3, s, p, s, p).transpose(1, 3, 0, 2, 4).reshape(s * s, 3 * p * p)
    x = x @ w["v.patch_embd.weight"].reshape(e, -1).T.astype(np.float64) + w["v.patch_embd.bias"]
    x = x + w["v.position_embd.weight"]
    hd = e // cfg.n_head
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        h = _layer_norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], cfg.eps)
        q, k, v = (_linear(h, w[b + f"attn_{n}.weight"], cfg.wtype) + w[b + f"attn_{n}.bias"] for n in "qkv")
        q, k, v = (t.reshape(-1, cfg.n_head, hd).transpose(1, 0, 2) for t in (q, k, v))
        a = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(-1, e)
        x = x + _linear(o, w[b + "attn_out.weight"], cfg.wtype) + w[b + "attn_out.bias"]
        h = _layer_norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], cfg.eps)
        h = numerics.gelu_f16_table(_linear(h, w[b + "ffn_up.weight"], cfg.wtype) + w[b + "ffn_up.bias"])
        x = x + _linear(h, w[b + "ffn_down.weight"], cfg.wtype) + w[b + "ffn_down.bias"]
    return _layer_norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], cfg.eps)


def pixel_shuffle(x: np.ndarray, width: int, height: int, k: int) -> np.ndarray:
    """Idefics3Connector.pixel_shuffle: x (width * height, n) patches row by row ->
    ((width / k) * (height / k), n k^2), blocks row by row, block (bx, by)'s row holding
    patch (bx k + dx, by k + dy) at n (dx + k dy)."""
    n = x.shape[1]
    grid = x.reshape(height // k, k, width // k, k, n)          # (by, dy, bx, dx, n)
    return grid.transpose(0, 2, 1, 3, 4).reshape((height // k) * (width // k), k * k * n)


def idefics3_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray) -> np.ndarray:
    """The idefics3 projector's output for one square ``pixels`` (3, S, S): (n_tokens, n_embd_out)."""
    x = siglip_reference(cfg, w, pixels)
    x = pixel_shuffle(x, cfg.side, cfg.side, cfg.n_merge)
    return _linear(x, w["mm.model.fc.weight"], cfg.wtype)


def vit_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray) -> np.ndarray:
    """The gemma3 projector's output for ``pixels`` (3, H, W), in float64 but for
    ggml's F16 roundings (matmul activations for F16 weights, the GELU table):
    (n_tokens, n_embd_out)."""
    s, e = cfg.side, cfg.n_embd
    x = siglip_reference(cfg, w, pixels)
    # Average over n_merge x n_merge windows of the patch grid, row by row.
    m, t = cfg.n_merge, s // cfg.n_merge
    x = x.reshape(t, m, t, m, e).mean(axis=(1, 3)).reshape(t * t, e)
    x = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + cfg.eps) * w["mm.soft_emb_norm.weight"]
    return numerics.matmul(x, w["mm.input_projection.weight"].T, "f16")


def _rope_vision(x: np.ndarray, ys: np.ndarray, xs: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """ggml_rope_multi's GGML_ROPE_TYPE_VISION over (n_pos, n_head, d): pair (i, i + d/2); the
    first d/4 pairs turn with the row, the next d/4 with the column, each section's
    frequencies starting over (theta_scale = base^(-2 / (d/2)))."""
    d = x.shape[-1]
    q = d // 4
    scale = base ** (-2.0 / (d // 2))
    k = np.arange(q)
    angles = np.concatenate([ys[:, None] * scale ** k, xs[:, None] * scale ** k], axis=1)   # (n_pos, d/2)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def qwen_vit_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray,
                       inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The qwen2vl / qwen25vl projector's output for ``pixels`` (3, H, W) and the encoder's named
    inputs (elelem.vision.qwen.encoder_inputs), float64 but for the F16 activations of F16
    matmuls (the patch kernel's im2col too) and the GELU table: (n_tokens, n_embd_out)."""
    p, e, wt = cfg.patch_size, cfg.n_embd, cfg.wtype
    rms = cfg.projector_type == "qwen2.5vl_merger"
    _, h, wd = pixels.shape
    ph, pw = h // p, wd // p
    cols = pixels.astype(np.float64).reshape(3, ph, p, pw, p).transpose(1, 3, 0, 2, 4).reshape(ph * pw, 3 * p * p)
    x = sum(numerics.matmul(cols, w[name].reshape(e, -1), wt) for name in ("v.patch_embd.weight",
                                                                         "v.patch_embd.weight.1"))
    # raster order -> 2 x 2 merge blocks, each block's four patches together
    x = x.reshape(ph // 2, 2, pw // 2, 2, e).transpose(0, 2, 1, 3, 4).reshape(-1, 4 * e)
    windows = "window_idx" in inputs
    if windows:
        x = x[inputs["inv_window_idx"]]
    x = x.reshape(-1, e)
    n = x.shape[0]
    pos = inputs["positions"].reshape(4, n)
    mask = inputs.get("window_mask")

    def norm(v, name):
        if rms:
            return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + cfg.eps) * w[name + ".weight"]
        return _layer_norm(v, w[name + ".weight"], w[name + ".bias"], cfg.eps)

    hd = e // cfg.n_head
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        t = norm(x, b + "ln1")
        q, k, v = (_linear(t, w[b + f"attn_{c}.weight"], wt) + w[b + f"attn_{c}.bias"] for c in "qkv")
        q, k = (_rope_vision(m.reshape(n, cfg.n_head, hd), pos[0], pos[1]) for m in (q, k))
        q, k, v = (m.reshape(n, cfg.n_head, hd).transpose(1, 0, 2) for m in (q, k, v))
        a = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        if windows and (i + 1) % cfg.n_wa_pattern != 0:
            a = np.where(mask == 0, a, -np.inf)
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(n, e)
        x = x + _linear(o, w[b + "attn_out.weight"], wt) + w[b + "attn_out.bias"]
        t = norm(x, b + "ln2")
        up = _linear(t, w[b + "ffn_up.weight"], wt) + w[b + "ffn_up.bias"]
        if rms:
            gate = _linear(t, w[b + "ffn_gate.weight"], wt) + w[b + "ffn_gate.bias"]
            t = gate / (1.0 + np.exp(-gate)) * up
        else:
            t = up / (1.0 + np.exp(-1.702 * up))
        x = x + _linear(t, w[b + "ffn_down.weight"], wt) + w[b + "ffn_down.bias"]
    x = norm(x, "v.post_ln").reshape(n // 4, 4 * e)
    x = numerics.gelu_f16_table(_linear(x, w["mm.0.weight"], wt) + w["mm.0.bias"])
    x = _linear(x, w["mm.2.weight"], wt) + w["mm.2.bias"]
    return x[inputs["window_idx"]] if windows else x


def rope_2d_interleaved(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """clip.cpp's build_rope_2d with interleave_freq over (n_pos, n_head, d): adjacent pairs;
    the first d/4 pairs turn with the patch's row at angles row * base^(-4i/d), the next d/4
    with its column at col * base^(-(4i+2)/d) (a half-width RoPE's frequencies, the
    second half's shifted by base^(-2/d): each half takes every other of the head's own)."""
    d = x.shape[-1]
    i = np.arange(d // 4)
    angles = np.concatenate([rows[:, None] * base ** (-4.0 * i / d), cols[:, None] * base ** (-(4.0 * i + 2) / d)],
                            axis=1)[:, None, :]                        # (n_pos, 1, d/2)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(angles) - b * np.sin(angles)
    out[..., 1::2] = a * np.sin(angles) + b * np.cos(angles)
    return out


def merge_patches(x: np.ndarray, side_x: int, side_y: int, k: int) -> np.ndarray:
    """torch's unfold of the (side_y, side_x) grid of x (n_pos, e) in k x k blocks, stride k
    (Mistral3PatchMerger): one row per block, blocks row-major, each row ordered
    (channel, block row, block column): (n_pos / k^2, e * k * k)."""
    e = x.shape[-1]
    g = x.reshape(side_y // k, k, side_x // k, k, e)                # (by, kh, bx, kw, e)
    return g.transpose(0, 2, 4, 1, 3).reshape(-1, e * k * k)


def pixtral_vit_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray) -> np.ndarray:
    """The pixtral projector's output for ``pixels`` (3, H, W), float64 but for the F16
    activations of F16 matmuls (the patch kernel's im2col too) and the GELU table:
    (n_tokens + rows - 1, n_embd_out), an [IMG_BREAK] row after each row of tokens but the last."""
    p, e, wt, k = cfg.patch_size, cfg.n_embd, cfg.wtype, cfg.n_merge
    _, h, wd = pixels.shape
    ph, pw = h // p, wd // p
    cols = pixels.astype(np.float64).reshape(3, ph, p, pw, p).transpose(1, 3, 0, 2, 4).reshape(ph * pw, 3 * p * p)
    x = numerics.matmul(cols, w["v.patch_embd.weight"].reshape(e, -1), wt)
    n = x.shape[0]
    pos = np.arange(n)
    rows_pos, cols_pos = pos // pw, pos % pw

    def rms(v, weight):
        return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + cfg.eps) * weight

    x = rms(x, w["v.pre_ln.weight"])
    hd = e // cfg.n_head
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        t = rms(x, w[b + "ln1.weight"])
        q, kk, v = (_linear(t, w[b + f"attn_{c}.weight"], wt).reshape(n, cfg.n_head, hd) for c in "qkv")
        q, kk = (rope_2d_interleaved(m, rows_pos, cols_pos) for m in (q, kk))
        q, kk, v = (m.transpose(1, 0, 2) for m in (q, kk, v))
        a = q @ kk.transpose(0, 2, 1) / np.sqrt(hd)
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        x = x + _linear((a @ v).transpose(1, 0, 2).reshape(n, e), w[b + "attn_out.weight"], wt)
        t = rms(x, w[b + "ln2.weight"])
        gate, up = _linear(t, w[b + "ffn_gate.weight"], wt), _linear(t, w[b + "ffn_up.weight"], wt)
        x = x + _linear(gate / (1.0 + np.exp(-gate)) * up, w[b + "ffn_down.weight"], wt)
    if k > 1:
        x = merge_patches(rms(x, w["mm.input_norm.weight"]), pw, ph, k)
        x = _linear(x, w["mm.patch_merger.weight"], wt)
    x = _linear(x, w["mm.1.weight"], wt) + w.get("mm.1.bias", 0.0)
    x = _linear(numerics.gelu_f16_table(x), w["mm.2.weight"], wt) + w.get("mm.2.bias", 0.0)
    n_cols, n_rows = pw // k, ph // k
    out = []
    for r in range(n_rows):
        out.append(x[r * n_cols:(r + 1) * n_cols])
        if r + 1 < n_rows:
            out.append(w["v.token_embd.img_break"][None, :].astype(np.float64))
    return np.concatenate(out)


def rope_2d_neox_halves(x: np.ndarray, cols: np.ndarray, rows: np.ndarray, base: float) -> np.ndarray:
    """clip_graph_gemma4v's 2D RoPE over (n_pos, n_head, d): the first half of each head a
    NeoX RoPE of width d/2 by the patch's column (pairs (i, i + d/4), angle
    col * base^(-2i / (d/2))), the second half the same by its row (ggml_rope_set_offset)."""
    d = x.shape[-1]
    half, quarter = d // 2, d // 4
    freqs = base ** (-2.0 * np.arange(quarter) / half)

    def neox(v, pos):
        ang = (pos[:, None] * freqs)[:, None, :]
        a, b = v[..., :quarter], v[..., quarter:]
        return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], axis=-1)

    return np.concatenate([neox(x[..., :half], cols), neox(x[..., half:], rows)], axis=-1)


def gemma4v_vit_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray,
                          clamps: bool = True) -> np.ndarray:
    """The gemma4v projector's output for ``pixels`` (3, H, W), float64 but for the F16
    activations of F16 matmuls (the patch kernel's im2col too): (n_tokens, n_embd_out).
    Every product whose weight has bounds in the file (``X.input_min`` ... ``X.output_max``)
    takes its input and its output clamped (Gemma4ClippableLinear); ``clamps=False``
    leaves them out (to show that they bind)."""
    p, e, wt, k = cfg.patch_size, cfg.n_embd, cfg.wtype, cfg.n_merge
    _, h, wd = pixels.shape
    ph, pw = h // p, wd // p
    n = ph * pw
    big = 3.4028234663852886e38

    def linear(x, stem):
        lo_in, hi_in, lo_out, hi_out = (float(w[f"{stem}.{s}"][0]) if clamps and f"{stem}.{s}" in w else d
                                        for s, d in (("input_min", -big), ("input_max", big),
                                                     ("output_min", -big), ("output_max", big)))
        return np.clip(_linear(np.clip(x, lo_in, hi_in), w[stem + ".weight"], wt), lo_out, hi_out)

    def rms(v, weight=None):
        v = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + cfg.eps)
        return v if weight is None else v * weight

    px = 2.0 * pixels.astype(np.float64) - 1.0
    cols_ = px.reshape(3, ph, p, pw, p).transpose(1, 3, 0, 2, 4).reshape(n, 3 * p * p)
    x = numerics.matmul(cols_, w["v.patch_embd.weight"].reshape(e, -1), wt)
    col, row = np.arange(n) % pw, np.arange(n) // pw
    x = x + w["v.position_embd.weight"][0][col] + w["v.position_embd.weight"][1][row]
    hd = e // cfg.n_head
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        t = rms(x, w[b + "ln1.weight"])
        q, kk, v = (linear(t, b + f"attn_{c}").reshape(n, cfg.n_head, hd) for c in "qkv")
        q, kk = rms(q, w[b + "attn_q_norm.weight"]), rms(kk, w[b + "attn_k_norm.weight"])
        q, kk = (rope_2d_neox_halves(m, col, row, 100.0) for m in (q, kk))
        v = rms(v)
        q, kk, v = (m.transpose(1, 0, 2) for m in (q, kk, v))
        a = q @ kk.transpose(0, 2, 1)                                   # attention scale 1
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        o = linear((a @ v).transpose(1, 0, 2).reshape(n, e), b + "attn_out")
        x = x + rms(o, w[b + "attn_post_norm.weight"])
        t = rms(x, w[b + "ln2.weight"])
        gate, up = linear(t, b + "ffn_gate"), linear(t, b + "ffn_up")
        t = linear(gate / (1.0 + np.exp(-1.702 * gate)) * up, b + "ffn_down")
        x = (x + rms(t, w[b + "ffn_post_norm.weight"])) * w[b + "out_scale.weight"]
    x = x.reshape(ph // k, k, pw // k, k, e).mean(axis=(1, 3)).reshape(-1, e) * np.sqrt(e)
    x = (x - w["v.std_bias"]) * w["v.std_scale"]
    return linear(rms(x), "mm.input_projection")


def _resize_align_corners(table: np.ndarray, ny: int, nx: int) -> np.ndarray:
    """ggml_interpolate's bilinear resize with GGML_SCALE_FLAG_ALIGN_CORNERS of a (rows, cols, e)
    table to (ny, nx, e): output i reads source i * (n_in - 1) / (n_out - 1) (n_in / n_out where
    a side is 1), between its floor and the next sample, clamped to the table."""
    def taps(n_out, n_in):
        scale = (n_out - 1) / (n_in - 1) if n_out > 1 and n_in > 1 else n_out / n_in
        c = np.arange(n_out, dtype=np.float64) / np.float32(scale)
        c0 = np.clip(np.floor(c).astype(int), 0, n_in - 1)
        return c0, np.minimum(c0 + 1, n_in - 1), np.clip(c - c0, 0.0, 1.0)

    y0, y1, dy = taps(ny, table.shape[0])
    x0, x1, dx = taps(nx, table.shape[1])
    top = table[y0][:, x0] * (1 - dx)[None, :, None] + table[y0][:, x1] * dx[None, :, None]
    bottom = table[y1][:, x0] * (1 - dx)[None, :, None] + table[y1][:, x1] * dx[None, :, None]
    return top * (1 - dy)[:, None, None] + bottom * dy[:, None, None]


def qwen3vl_vit_reference(cfg: TinyProjector, w: dict[str, np.ndarray], pixels: np.ndarray,
                          inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The qwen3vl projector's output for ``pixels`` (3, H, W): the patches plus their bias and
    the position table resized to the grid, LayerNorm layers with one Q/K/V product, the
    2D RoPE, and after each deepstack layer its merger's output; the main merger's output
    then the deepstack ones, side by side: (n_tokens, n_embd_out * (1 + len(cfg.deepstack))).
    float64 but for the F16 activations of F16 matmuls and the GELU table."""
    p, e, wt = cfg.patch_size, cfg.n_embd, cfg.wtype
    _, h, wd = pixels.shape
    ph, pw = h // p, wd // p
    cols = pixels.astype(np.float64).reshape(3, ph, p, pw, p).transpose(1, 3, 0, 2, 4).reshape(ph * pw, 3 * p * p)
    x = sum(numerics.matmul(cols, w[name].reshape(e, -1), wt) for name in ("v.patch_embd.weight",
                                                                         "v.patch_embd.weight.1"))
    x = x + w["v.patch_embd.bias"]
    table = w["v.position_embd.weight"].astype(np.float64).reshape(cfg.side, cfg.side, e)
    x = x + (table if (ph, pw) == (cfg.side, cfg.side) else _resize_align_corners(table, ph, pw)).reshape(-1, e)
    x = x.reshape(ph // 2, 2, pw // 2, 2, e).transpose(0, 2, 1, 3, 4).reshape(-1, e)   # merge-block order
    n = x.shape[0]
    pos = inputs["positions"].reshape(4, n)
    hd = e // cfg.n_head

    def merger(v, w1, b1, w2, b2):
        return _linear(numerics.gelu_f16_table(_linear(v, w[w1], wt) + w[b1]), w[w2], wt) + w[b2]

    deepstack = []
    for i in range(cfg.n_layer):
        b = f"v.blk.{i}."
        t = _layer_norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], cfg.eps)
        qkv = _linear(t, w[b + "attn_qkv.weight"], wt) + w[b + "attn_qkv.bias"]
        q, k, v = qkv[:, :e], qkv[:, e:2 * e], qkv[:, 2 * e:]
        q, k = (_rope_vision(m.reshape(n, cfg.n_head, hd), pos[0], pos[1]) for m in (q, k))
        q, k, v = (m.reshape(n, cfg.n_head, hd).transpose(1, 0, 2) for m in (q, k, v))
        a = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(n, e)
        x = x + _linear(o, w[b + "attn_out.weight"], wt) + w[b + "attn_out.bias"]
        t = _layer_norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], cfg.eps)
        t = numerics.gelu_f16_table(_linear(t, w[b + "ffn_up.weight"], wt) + w[b + "ffn_up.bias"])
        x = x + _linear(t, w[b + "ffn_down.weight"], wt) + w[b + "ffn_down.bias"]
        if i in cfg.deepstack:
            d = f"v.deepstack.{i}."
            t = _layer_norm(x.reshape(n // 4, 4 * e), w[d + "norm.weight"], w[d + "norm.bias"], cfg.eps)
            deepstack.append(merger(t, d + "fc1.weight", d + "fc1.bias", d + "fc2.weight", d + "fc2.bias"))
    x = _layer_norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], cfg.eps).reshape(n // 4, 4 * e)
    return np.concatenate([merger(x, "mm.0.weight", "mm.0.bias", "mm.2.weight", "mm.2.bias")] + deepstack, axis=1)
