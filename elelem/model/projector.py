"""Projector files: the vision encoder and projector of a multimodal model (an
"mmproj" GGUF, ``general.architecture = clip``), read and checked.

llama.cpp's libmtmd reads the same files (tools/mtmd/clip.cpp, keys and
tensor names in clip-impl.h); the converter writes them with its ``MmprojModel``
classes (conversion/base.py, conversion/gemma.py).  :func:`read_projector`
checks every key and tensor the encoder will use, so that a bad file raises a
clear error naming the key or the tensor before the native core maps it.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import GGUFMetadataError, ModelShapeError, UnsupportedArchitectureError
from ..gguf import GGML_TYPES, GGUFFile, GGUFValueType, read_gguf

ARCHITECTURE = "clip"

# Bounds a file may not pass: an encoder wider, deeper or with larger images
# than any released one is a broken (or hostile) file, not a model.
MAX_WIDTH = 1 << 16
MAX_LAYERS = 512
MAX_IMAGE_SIZE = 8192


@dataclass(frozen=True)
class ProjectorKind:
    """What libmtmd does for one projector type: its image markers in the
    text (mtmd.cpp, mtmd_context's constructor), its resize filter
    (clip.cpp's load_hparams) and whether the text model attends within an
    image both ways (mtmd_decode_use_non_causal)."""

    image_begin: str
    image_end: str
    resize: str              # "bilinear", "bicubic" or "lanczos"
    non_causal: bool
    default_merge: int       # the pooling (gemma3, gemma4v) or merge (qwen2vl) window's side where the file gives none
    dynamic_size: bool = False   # Qwen's smart resize: images keep their aspect ratio, not fitted to a square
    mrope: bool = False      # the text model places an image's rows in 2D (M-RoPE: mtmd_decode_use_mrope)
    # Text widths for which non_causal does not hold (gemma4v: E2B's 1536 and E4B's 2560).
    causal_text_widths: tuple[int, ...] = ()
    # Images of any size, resized to keep their aspect ratio within (min, max) image tokens
    # (clip.cpp's set_limit_image_tokens, mtmd_image_preprocessor_dyn_size: gemma4v); None: not so.
    image_tokens: Optional[tuple[int, int]] = None
    # The image cut into image_size squares plus an overview, with text between them
    # (mtmd's slice templates: elelem.vision.slices); None: one square or one dynamic image.
    slices: Optional[str] = None

    def attends_both_ways(self, n_embd_text: int) -> bool:
        """mtmd_decode_use_non_causal for a text model ``n_embd_text`` wide."""
        return self.non_causal and n_embd_text not in self.causal_text_widths


#: Text architectures whose graphs take an image's embeddings in place of tokens.
ARCHS_WITH_IMAGES = ("gemma3", "gemma4", "qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "mistral3",
                     "llama", "lfm2")   # llama: Pixtral 12B, Mistral Small 3.1, SmolVLM

# The projector types elelem encodes; each has a builder in elelem/_native/graph/vision_<type>.pxi.
_QWEN = ProjectorKind("<|vision_start|>", "<|vision_end|>", "bicubic", non_causal=False, default_merge=2,
                      dynamic_size=True, mrope=True)
KINDS: dict[str, ProjectorKind] = {
    "gemma3": ProjectorKind("<start_of_image>", "<end_of_image>", "bilinear", non_causal=True, default_merge=4),
    "qwen2vl_merger": _QWEN,           # Qwen2-VL
    "qwen2.5vl_merger": _QWEN,         # Qwen2.5-VL (and Qwen2.5-Omni's vision half, "qwen2.5o")
    "qwen3vl_merger": _QWEN,           # Qwen3-VL, and Qwen3.5 / 3.6's vision half (the converter's Qwen3VLVisionModel)
    "gemma4v": ProjectorKind("<|image>", "<image|>", "bicubic", non_causal=True, default_merge=3,
                             causal_text_widths=(1536, 2560), image_tokens=(70, 1120)),
    # No text before the image: its rows end with [IMG_BREAK] (the projector's own embedding)
    # but the last, and [IMG_END] follows it (mtmd.cpp); pixtral-12b merges no patches.
    "pixtral": ProjectorKind("", "[IMG_END]", "bicubic", non_causal=False, default_merge=1,
                             image_tokens=(8, 1024)),
    # SmolVLM: no text around the whole image, only between its slices (mtmd.cpp, MTMD_SLICE_TMPL_IDEFICS3).
    "idefics3": ProjectorKind("", "", "lanczos", non_causal=False, default_merge=2, slices="idefics3"),
    # LFM2-VL: any size within 64 to 256 tokens, or 512-pixel tiles and a thumbnail past twice that
    # (clip.cpp's load_hparams: set_limit_image_tokens(64, 256); mtmd_image_preprocessor_lfm2).
    "lfm2": ProjectorKind("<|image_start|>", "<|image_end|>", "bilinear", non_causal=False, default_merge=2,
                          image_tokens=(64, 256), slices="lfm2"),
}
QWEN_TYPES = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
# clip.cpp's set_limit_image_tokens(8, 4096) for the Qwen-VL types: merged tokens per image.
QWEN_MIN_TOKENS, QWEN_MAX_TOKENS = 8, 4096

_NORM_TYPES = ("F32",)
_CONV_TYPES = ("F32", "F16")   # ggml's im2col takes these kernels


@dataclass(frozen=True)
class ProjectorSpec:
    """A checked projector file: what the native core opens and what the
    image preprocessing needs."""

    path: Path
    projector_type: str
    kind: ProjectorKind
    hparams: dict[str, Any]                      # VisionHParams' fields by name (elelem/_native/graph/vit.pxi)
    global_tensors: dict[str, Optional[str]]     # VISION_GLOBAL_ROLES -> tensor name
    layer_tensors: list[dict[str, Optional[str]]] = field(repr=False)
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # Gemma 4's clippable linears: weight name -> (input min, input max, output min, output max)
    clamps: dict[str, tuple[float, float, float, float]] = field(default_factory=dict, repr=False)

    @property
    def image_size(self) -> int:
        return int(self.hparams["image_size"])

    @property
    def n_embd_out(self) -> int:
        """The text model's width, which every image embedding has."""
        return int(self.hparams["n_embd_out"])

    @property
    def n_deepstack(self) -> int:
        """Qwen3-VL: the layers whose merged outputs follow the main embedding in each row."""
        return int(self.hparams.get("n_deepstack", 0))

    @property
    def row_width(self) -> int:
        """The width of an image embedding's row: the text width, once more per deepstack layer."""
        return self.n_embd_out * (1 + self.n_deepstack)

    @property
    def tokens_per_square(self) -> int:
        """Embeddings per encoded square of image_size a side."""
        side = self.image_size // self.hparams["patch_size"] // self.hparams["n_merge"]
        return side * side

    @property
    def n_image_tokens(self) -> int:
        """Embeddings per image (gemma3: a fixed-size image pooled to (side / n_merge)^2;
        for Qwen's dynamic size, an image of the file's image_size a side); for a
        projector with limits on an image's tokens (gemma4v) or with slices (idefics3), the most
        an image gives."""
        if self.kind.image_tokens is not None:
            if self.kind.slices == "lfm2":
                # 10 tiles of 512 pixels a side at most, and the thumbnail (mtmd_image_preprocessor_lfm2's max_tiles).
                tile = 512 // (self.hparams["patch_size"] * self.hparams["n_merge"])
                return 10 * tile * tile + self.kind.image_tokens[1]
            return self.kind.image_tokens[1]
        if self.kind.slices is not None:
            # The most slices a side (the longest edge over the square, rounded up), squared, plus the overview.
            most = -(-self.hparams["longest_edge"] // self.image_size)
            return (most * most + 1) * self.tokens_per_square
        side = self.image_size // self.hparams["patch_size"] // self.hparams["n_merge"]
        return side * side


def read_projector(path: str | os.PathLike) -> ProjectorSpec:
    """Read and check the projector file at ``path``.

    Raises ModelNotFoundError for a missing file, a GGUFError subclass for a
    malformed file or a missing or mistyped key (naming the key),
    UnsupportedArchitectureError for a file that is not a vision projector
    or whose projector type elelem does not encode, and ModelShapeError for a
    missing tensor or one of the wrong shape or type (naming the tensor)."""
    gguf = read_gguf(path)
    arch = gguf.expect_scalar("general.architecture", GGUFValueType.STRING)
    if arch != ARCHITECTURE:
        raise UnsupportedArchitectureError(
            f"{gguf.path} is a {arch!r} model, not a projector file (general.architecture {ARCHITECTURE!r})")
    if not gguf.expect_scalar("clip.has_vision_encoder", GGUFValueType.BOOL, required=False):
        raise UnsupportedArchitectureError(f"{gguf.path}: the projector has no vision encoder "
                                           f"(clip.has_vision_encoder is not true); elelem reads images only")
    ptype = gguf.expect_scalar("clip.projector_type", GGUFValueType.STRING, required=False)
    if ptype is None:
        ptype = gguf.expect_scalar("clip.vision.projector_type", GGUFValueType.STRING)
    if ptype == "qwen2.5o":   # Qwen2.5-Omni's vision half: clip.cpp reads it as qwen25vl
        ptype = "qwen2.5vl_merger"
    kind = KINDS.get(ptype)
    if kind is None:
        raise UnsupportedArchitectureError(
            f"{gguf.path}: projector type {ptype!r} is not supported; elelem encodes images for "
            f"{', '.join(sorted(KINDS))}")
    hparams = _read_hparams(gguf, kind, ptype)
    mean = _three_floats(gguf, "clip.vision.image_mean")
    std = _three_floats(gguf, "clip.vision.image_std")
    if any(s == 0.0 or not math.isfinite(s) for s in std) or not all(math.isfinite(m) for m in mean):
        raise GGUFMetadataError(f"{gguf.path}: clip.vision.image_std must be finite and non-zero, "
                                f"image_mean finite; got {std}, {mean}", field="clip.vision.image_std")
    global_tensors, layer_tensors = _read_tensors(gguf, hparams, ptype)
    clamps = _read_clamps(gguf, global_tensors, layer_tensors) if ptype == "gemma4v" else {}
    return ProjectorSpec(Path(gguf.path), ptype, kind, hparams, global_tensors, layer_tensors, mean, std, clamps)


def _u32(gguf: GGUFFile, key: str, *, low: int = 1, high: int = MAX_WIDTH) -> int:
    value = _u32_optional(gguf, key, low=low, high=high, required=True)
    assert value is not None
    return value


def _u32_optional(gguf: GGUFFile, key: str, *, low: int = 1, high: int = MAX_WIDTH,
                  required: bool = False) -> Optional[int]:
    value = gguf.expect_scalar(key, GGUFValueType.UINT32, GGUFValueType.INT32, required=required)
    if value is None:
        return None
    if not low <= value <= high:
        raise GGUFMetadataError(f"{gguf.path}: key '{key}' is {value}, outside {low}..{high}", field=key)
    return int(value)


def _three_floats(gguf: GGUFFile, key: str) -> tuple[float, float, float]:
    values = gguf.expect_array(key, GGUFValueType.FLOAT32)
    if len(values) < 3:
        raise GGUFMetadataError(f"{gguf.path}: key '{key}' needs 3 values (R, G, B), has {len(values)}", field=key)
    return (float(values[0]), float(values[1]), float(values[2]))


def _read_hparams(gguf: GGUFFile, kind: ProjectorKind, ptype: str) -> dict[str, Any]:
    p = "clip.vision."
    n_embd = _u32(gguf, p + "embedding_length")
    n_head = _u32(gguf, p + "attention.head_count")
    n_head_kv = _u32_optional(gguf, p + "attention.head_count_kv")
    if n_head_kv is not None and n_head_kv != n_head:
        raise UnsupportedArchitectureError(f"{gguf.path}: a vision encoder with grouped-query attention "
                                           f"({n_head} heads, {n_head_kv} KV heads) is not supported")
    d_head = _u32_optional(gguf, p + "attention.head_dim")
    if d_head is None:
        if n_embd % n_head:
            raise GGUFMetadataError(f"{gguf.path}: {p}embedding_length {n_embd} is not a multiple of "
                                    f"{p}attention.head_count {n_head}", field=p + "attention.head_count")
        d_head = n_embd // n_head
    eps = gguf.expect_scalar(p + "attention.layer_norm_epsilon", GGUFValueType.FLOAT32)
    if not (math.isfinite(eps) and eps >= 0):
        raise GGUFMetadataError(f"{gguf.path}: {p}attention.layer_norm_epsilon is {eps}",
                                field=p + "attention.layer_norm_epsilon")
    image_size = _u32(gguf, p + "image_size", high=MAX_IMAGE_SIZE)
    patch_size = _u32(gguf, p + "patch_size", high=MAX_IMAGE_SIZE)
    merge_key = p + ("spatial_merge_size" if ptype in QWEN_TYPES + ("pixtral",) else "projector.scale_factor")
    n_merge = _u32_optional(gguf, merge_key, high=MAX_IMAGE_SIZE) or kind.default_merge
    if ptype in QWEN_TYPES and n_merge != 2:
        # clip.cpp's qwen2vl graph merges 2 x 2 blocks whatever the key says (clip_graph_qwen2vl::build).
        raise GGUFMetadataError(f"{gguf.path}: {merge_key} is {n_merge}; the Qwen-VL merger takes 2 x 2 patches",
                                field=merge_key)
    side = image_size // patch_size
    # A variable-size encoder's image_size is not used (Gemma 4's converter writes 224).
    # SmolVLM2's 384-pixel squares in patches of 14 leave 6 pixels the convolution never reads (27 patches).
    partial_patch = kind.slices is not None
    if kind.image_tokens is None and ((image_size % patch_size and not partial_patch)
                                      or (side % n_merge and not kind.dynamic_size)):
        raise GGUFMetadataError(
            f"{gguf.path}: {p}image_size {image_size} must be a multiple of {p}patch_size {patch_size}, and its "
            f"{side} patches a side a multiple of the pooling window {n_merge}", field=p + "image_size")
    if kind.slices == "idefics3":
        # The preprocessor's longest edge: libmtmd slices without it otherwise (an older path elelem does not take).
        longest = _u32(gguf, p + "preproc_image_size", high=MAX_IMAGE_SIZE * 4)
        extra_slices = {"longest_edge": longest}
    else:
        extra_slices = {}
    use_gelu = gguf.expect_scalar("clip.use_gelu", GGUFValueType.BOOL, required=False)
    use_silu = gguf.expect_scalar("clip.use_silu", GGUFValueType.BOOL, required=False)
    if use_gelu and use_silu:
        raise GGUFMetadataError(f"{gguf.path}: clip.use_gelu and clip.use_silu are both true", field="clip.use_silu")
    extra: dict[str, Any] = {}
    if ptype in QWEN_TYPES:
        if d_head % 4:
            raise GGUFMetadataError(f"{gguf.path}: the Qwen-VL encoder's head width {d_head} must be a multiple of 4 "
                                    f"(2D rotary sections)", field=p + "attention.head_count")
        n_wa = _u32_optional(gguf, p + "n_wa_pattern", low=0, high=MAX_LAYERS, required=ptype == "qwen2.5vl_merger")
        if ptype == "qwen3vl_merger":
            n_wa = 0   # clip_graph_qwen3vl attends fully in every layer
        extra = {"dynamic_size": True, "norm": "rms" if ptype == "qwen2.5vl_merger" else "layer",
                 "n_wa_pattern": n_wa or 0, "attn_window": 112}   # clip.cpp's default window, in pixels
    # The Qwen-VL converter writes the merger's width as feed_forward_length (clip.cpp
    # never reads it for them): the layers' width comes from their tensors.
    n_ff = _qwen_n_ff(gguf, n_embd) if ptype in QWEN_TYPES else _u32(gguf, p + "feed_forward_length",
                                                                     high=MAX_WIDTH * 8)
    return {
        **extra, **extra_slices,
        "n_embd": n_embd, "n_head": n_head, "d_head": d_head,
        "n_ff": n_ff,
        "n_layer": _u32(gguf, p + "block_count", high=MAX_LAYERS),
        "n_embd_out": _u32(gguf, p + "projection_dim", high=MAX_WIDTH),
        "image_size": image_size, "patch_size": patch_size, "n_merge": n_merge,
        "ffn_op": "gelu" if use_gelu else "silu" if use_silu else "gelu_quick",
        "eps": float(eps),
        **_TYPE_HPARAMS.get(ptype, {}),
    }


def _qwen_n_ff(gguf: GGUFFile, n_embd: int) -> int:
    info = gguf.tensors.get("v.blk.0.ffn_up.weight")
    if info is None or len(info.shape) != 2 or n_embd not in info.shape:
        raise ModelShapeError(f"{gguf.path}: tensor 'v.blk.0.ffn_up.weight' is missing or not ({n_embd}, n_ff)")
    n_ff = int(info.shape[1] if info.shape[0] == n_embd else info.shape[0])
    if not 1 <= n_ff <= MAX_WIDTH * 8:
        raise ModelShapeError(f"{gguf.path}: the encoder's FFN width {n_ff} is out of range")
    return n_ff


# What clip.cpp fixes per projector type rather than reading (load_hparams, the graph builders).
_TYPE_HPARAMS: dict[str, dict[str, Any]] = {
    # clip_graph_gemma4v: RMSNorms, V normed, attention scale 1, a 2D RoPE of base 100.
    "gemma4v": {"norm": "rms", "v_norm": True, "kq_scale": 1.0, "rope_theta": 100.0, "dynamic_size": True},
    # clip_graph_pixtral: RMSNorms, a 2D RoPE of base 10000 with interleaved frequencies
    # (clip.cpp sets the base whatever the file's rope.freq_base says).
    "pixtral": {"norm": "rms", "rope_theta": 10000.0, "rope_2d_interleaved": True, "dynamic_size": True},
    "lfm2": {"dynamic_size": True},
}


class _Tensors:
    """The file's tensors, checked one by one against the shapes the encoder reads."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def get(self, name: str, shape: tuple[int, ...], *, required: bool = True,
            types: Optional[tuple[str, ...]] = None) -> Optional[str]:
        info = self.gguf.tensors.get(name)
        if info is None:
            if required:
                raise ModelShapeError(f"{self.gguf.path}: required tensor {name!r} is missing")
            return None
        if tuple(info.shape) != shape:
            raise ModelShapeError(f"{self.gguf.path}: tensor {name!r} has shape {list(info.shape)}, "
                                  f"expected {list(shape)} (ggml order)")
        type_name = GGML_TYPES[info.ggml_type][0]
        if types is not None and type_name not in types:
            raise ModelShapeError(f"{self.gguf.path}: tensor {name!r} is {type_name}; it must be "
                                  f"{' or '.join(types)}")
        return name

    def shape(self, name: str) -> Optional[tuple[int, ...]]:
        info = self.gguf.tensors.get(name)
        return None if info is None else tuple(info.shape)


def _read_tensors(gguf: GGUFFile, h: dict[str, Any], ptype: str) -> tuple[dict, list]:
    t = _Tensors(gguf)
    n_embd, n_ff, width = h["n_embd"], h["n_ff"], h["n_head"] * h["d_head"]
    p, side = h["patch_size"], h["image_size"] // h["patch_size"]
    vec = _NORM_TYPES
    qwen = ptype in QWEN_TYPES
    gemma4v = ptype == "gemma4v"
    glob = {
        "patch_embd": t.get("v.patch_embd.weight", (p, p, 3, n_embd), types=_CONV_TYPES),
        "pre_ln_w": t.get("v.pre_ln.weight", (n_embd,), required=False, types=vec),
        "pre_ln_b": t.get("v.pre_ln.bias", (n_embd,), required=False, types=vec),
        "post_ln_w": t.get("v.post_ln.weight", (n_embd,), required=False, types=vec),
        "post_ln_b": t.get("v.post_ln.bias", (n_embd,), required=False, types=vec),
    }
    if ptype == "gemma3":
        glob["patch_bias"] = t.get("v.patch_embd.bias", (n_embd,), required=False, types=vec)
        glob["pos_embd"] = t.get("v.position_embd.weight", (n_embd, side * side))
        # Transposed in the graph (a ggml_cont of a transpose): the converter writes it F16.
        glob["mm_input_proj"] = t.get("mm.input_projection.weight", (h["n_embd_out"], n_embd), types=_CONV_TYPES)
        glob["mm_soft_emb_norm"] = t.get("mm.soft_emb_norm.weight", (n_embd,), types=vec)
    elif qwen:
        # The converter splits the Conv3D kernel's two temporal slices (Qwen2VLVisionModel.modify_tensors)
        # and writes the merger's MLP as mm.0 and mm.2; clip_graph_qwen2vl asserts the patch bias
        # away, and the positions are rotary.
        merged = 4 * n_embd
        glob["patch_embd_1"] = t.get("v.patch_embd.weight.1", (p, p, 3, n_embd), types=_CONV_TYPES)
        glob["mm_0_w"] = t.get("mm.0.weight", (merged, merged))
        glob["mm_0_b"] = t.get("mm.0.bias", (merged,), types=vec)
        glob["mm_1_w"] = t.get("mm.2.weight", (merged, h["n_embd_out"]))
        glob["mm_1_b"] = t.get("mm.2.bias", (h["n_embd_out"],), types=vec)
        if ptype == "qwen3vl_merger":
            # clip_graph_qwen3vl asserts a patch bias and a learned position table (num_position_embeddings
            # rows: the converter's image_size is its side times the patch), resized to each image's grid.
            glob["patch_bias"] = t.get("v.patch_embd.bias", (n_embd,), types=vec)
            glob["pos_embd"] = t.get("v.position_embd.weight", (n_embd, side * side), types=("F32",))
        elif t.shape("v.patch_embd.bias") is not None:
            raise ModelShapeError(f"{gguf.path}: a Qwen-VL patch embedding has no bias (v.patch_embd.bias)")
        else:
            glob["patch_bias"] = glob["pos_embd"] = None
    elif ptype == "idefics3":
        # Idefics3Connector: the pixel shuffle's n_merge^2 neighbours side by side, then one linear
        # without bias (the converter's mm.model.fc), as wide as the text model.
        glob["patch_bias"] = t.get("v.patch_embd.bias", (n_embd,), required=False, types=vec)
        glob["pos_embd"] = t.get("v.position_embd.weight", (n_embd, side * side))
        glob["mm_input_proj"] = t.get("mm.model.fc.weight", (n_embd * h["n_merge"] ** 2, h["n_embd_out"]))
    elif ptype == "lfm2":
        # Siglip2VisionEmbeddings' patch embedding (a linear the converter reshapes to a convolution kernel)
        # and its square position table; Lfm2VlMultiModalProjector's optional LayerNorm, linear_1, linear_2.
        n_pos = (t.shape("v.position_embd.weight") or (0, 0))[-1]
        if math.isqrt(n_pos) ** 2 != n_pos or not 1 <= n_pos <= MAX_IMAGE_SIZE ** 2:
            raise ModelShapeError(f"{gguf.path}: tensor 'v.position_embd.weight' must hold a square grid of "
                                  f"positions; it has {n_pos}")
        glob["patch_bias"] = t.get("v.patch_embd.bias", (n_embd,), required=False, types=vec)
        glob["pos_embd"] = t.get("v.position_embd.weight", (n_embd, n_pos), types=("F32", "F16"))
        merged = n_embd * h["n_merge"] ** 2
        glob["mm_norm_w"] = t.get("mm.input_norm.weight", (merged,), required=False, types=vec)
        glob["mm_norm_b"] = t.get("mm.input_norm.bias", (merged,), required=False, types=vec)
        hidden = (t.shape("mm.1.weight") or (merged, 0))[-1]
        if not 1 <= hidden <= MAX_WIDTH * 8:
            raise ModelShapeError(f"{gguf.path}: tensor 'mm.1.weight' is missing or has no rows")
        glob["mm_0_w"] = t.get("mm.1.weight", (merged, hidden))
        glob["mm_0_b"] = t.get("mm.1.bias", (hidden,), types=vec)
        glob["mm_1_w"] = t.get("mm.2.weight", (hidden, h["n_embd_out"]))
        glob["mm_1_b"] = t.get("mm.2.bias", (h["n_embd_out"],), types=vec)
    elif gemma4v:
        # Two position tables, the columns' and the rows' (the converter's position_embedding_table,
        # forced F32); clip_graph_gemma4v reads no patch bias.
        shape = t.shape("v.position_embd.weight")
        pos_size = shape[1] if shape is not None and len(shape) == 3 else 1
        if not 1 <= pos_size <= MAX_IMAGE_SIZE:
            raise ModelShapeError(f"{gguf.path}: tensor 'v.position_embd.weight' has {pos_size} positions, "
                                  f"outside 1..{MAX_IMAGE_SIZE}")
        glob["pos_embd"] = t.get("v.position_embd.weight", (n_embd, pos_size, 2), types=("F32", "F16"))
        h["pos_size"] = pos_size
        glob["mm_input_proj"] = t.get("mm.input_projection.weight", (n_embd, h["n_embd_out"]))
        glob["std_bias"] = t.get("v.std_bias", (n_embd,), required=False, types=vec)
        glob["std_scale"] = t.get("v.std_scale", (n_embd,), required=False, types=vec)
    elif ptype == "pixtral":
        glob.update(_pixtral_tensors(t, h))
    layers = []
    for il in range(h["n_layer"]):
        b = f"v.blk.{il}."
        up, down = b + "ffn_up", b + "ffn_down"
        # Older converters named SigLIP's fc1 ffn_down and fc2 ffn_up; clip.cpp swaps them back
        # where "down" takes the encoder's width (clip_model_loader, is_ffn_swapped).
        down_shape = t.shape(down + ".weight")
        if down_shape is not None and down_shape[0] == n_embd and n_ff != n_embd:
            up, down = down, up

        def norm(name: str, required: bool = True) -> Optional[str]:
            return t.get(b + name, (n_embd,), required=required, types=vec)

        def bias(name: str, n: int) -> Optional[str]:
            return t.get(name, (n,), required=False, types=vec)

        fused = ptype == "qwen3vl_merger"   # the converter keeps Qwen3-VL's attn.qkv whole
        layer = {
            "ln1_w": norm("ln1.weight"), "ln1_b": bias(b + "ln1.bias", n_embd),
            "q_w": t.get(b + "attn_q.weight", (n_embd, width), required=not fused),
            "q_b": bias(b + "attn_q.bias", width),
            "k_w": t.get(b + "attn_k.weight", (n_embd, width), required=not fused),
            "k_b": bias(b + "attn_k.bias", width),
            "v_w": t.get(b + "attn_v.weight", (n_embd, width), required=not fused),
            "v_b": bias(b + "attn_v.bias", width),
            "o_w": t.get(b + "attn_out.weight", (width, n_embd)), "o_b": bias(b + "attn_out.bias", n_embd),
            "ln2_w": norm("ln2.weight"), "ln2_b": bias(b + "ln2.bias", n_embd),
            "up_w": t.get(up + ".weight", (n_embd, n_ff)), "up_b": bias(up + ".bias", n_ff),
            "gate_w": t.get(b + "ffn_gate.weight", (n_embd, n_ff), required=False),
            "gate_b": bias(b + "ffn_gate.bias", n_ff),
            "down_w": t.get(down + ".weight", (n_ff, n_embd)), "down_b": bias(down + ".bias", n_embd),
        }
        if fused:
            if any(layer[r] for r in ("q_w", "k_w", "v_w")):
                raise ModelShapeError(f"{gguf.path}: layer {il} of a qwen3vl projector has split Q/K/V tensors; "
                                      f"clip_graph_qwen3vl reads one {b}attn_qkv")
            layer.update({"qkv_w": t.get(b + "attn_qkv.weight", (n_embd, 3 * width)),
                          "qkv_b": t.get(b + "attn_qkv.bias", (3 * width,), types=vec)})
            layer.update(_deepstack_tensors(t, il, 4 * n_embd, h["n_embd_out"]))
        if gemma4v:
            d_head = h["d_head"]
            layer.update({
                "q_norm": t.get(b + "attn_q_norm.weight", (d_head,), types=vec),
                "k_norm": t.get(b + "attn_k_norm.weight", (d_head,), types=vec),
                "attn_post_norm": norm("attn_post_norm.weight"),
                "ffn_post_norm": norm("ffn_post_norm.weight"),
                "out_scale": _scale(t, b + "out_scale.weight", n_embd),
            })
        layers.append(layer)
    if qwen:
        h["n_deepstack"] = sum(1 for layer in layers if layer.get("ds_fc1_w"))
    return glob, layers


def _pixtral_tensors(t: _Tensors, h: dict[str, Any]) -> dict[str, Optional[str]]:
    """LlavaVisionModel's layout (conversion/llava.py): the adapter's two linears as mm.1 and
    mm.2 (biases optional), the [IMG_BREAK] row of the text model's embeddings, and for
    Mistral Small 3.1 the merger's RMSNorm and projection.  A merge window wider than one
    patch needs the merger, and the merger a window (clip.cpp would assert or give fewer
    embeddings than it counts)."""
    n_embd, n_out, k = h["n_embd"], h["n_embd_out"], h["n_merge"]
    if k < 2 and t.shape("mm.patch_merger.weight") is not None:
        raise ModelShapeError(f"{t.gguf.path}: tensor 'mm.patch_merger.weight' merges patches, but "
                              f"clip.vision.spatial_merge_size is {k}")
    merger = t.get("mm.patch_merger.weight", (n_embd * k * k, n_embd), required=k > 1)
    return {
        "patch_bias": t.get("v.patch_embd.bias", (n_embd,), required=False, types=_NORM_TYPES),
        "mm_input_norm": t.get("mm.input_norm.weight", (n_embd,), required=merger is not None, types=_NORM_TYPES),
        "mm_patch_merger": merger,
        "mm_0_w": t.get("mm.1.weight", (n_embd, n_out)),
        "mm_0_b": t.get("mm.1.bias", (n_out,), required=False, types=_NORM_TYPES),
        "mm_1_w": t.get("mm.2.weight", (n_out, n_out)),
        "mm_1_b": t.get("mm.2.bias", (n_out,), required=False, types=_NORM_TYPES),
        "img_break": t.get("v.token_embd.img_break", (n_out,), types=_NORM_TYPES),
    }


def _deepstack_tensors(t: _Tensors, il: int, merged: int, n_embd_out: int) -> dict[str, Optional[str]]:
    """Layer il's deepstack merger (clip.cpp's TN_DEEPSTACK_*): all of it or none of it."""
    b = f"v.deepstack.{il}."
    present = [name for name in (b + "norm.weight", b + "fc1.weight", b + "fc2.weight") if t.shape(name) is not None]
    if not present:
        return {}
    vec = _NORM_TYPES
    return {
        "ds_norm_w": t.get(b + "norm.weight", (merged,), types=vec),
        "ds_norm_b": t.get(b + "norm.bias", (merged,), types=vec),
        "ds_fc1_w": t.get(b + "fc1.weight", (merged, merged)),
        "ds_fc1_b": t.get(b + "fc1.bias", (merged,), types=vec),
        "ds_fc2_w": t.get(b + "fc2.weight", (merged, n_embd_out)),
        "ds_fc2_b": t.get(b + "fc2.bias", (n_embd_out,), types=vec),
    }


def _scale(t: _Tensors, name: str, n_embd: int) -> Optional[str]:
    """An optional scale that broadcasts over a row: one value (Gemma 4's layer_scalar) or n_embd."""
    shape = t.shape(name)
    return t.get(name, shape if shape in ((1,), (n_embd,)) else (n_embd,), required=False, types=_NORM_TYPES)


# The clamp tensors beside a clippable weight, in the order the native core takes them, and what
# clip.cpp takes where one is absent (get_scalar's default: FLT_MAX either way).
_FLT_MAX = 3.4028234663852886e38
_CLAMP_SUFFIXES = ((".input_min", -_FLT_MAX), (".input_max", _FLT_MAX), (".output_min", -_FLT_MAX),
                   (".output_max", _FLT_MAX))
_CLIPPABLE_LAYER_ROLES = ("q_w", "k_w", "v_w", "o_w", "up_w", "gate_w", "down_w")


def _read_clamps(gguf: GGUFFile, glob: dict, layers: list) -> dict[str, tuple[float, float, float, float]]:
    """Gemma4ClippableLinear's bounds: for each product's weight ``X.weight``, the scalars
    ``X.input_min`` ... ``X.output_max`` where the file has any of them (clip.cpp's
    clamp_info_map; a product without any is clamped to +-FLT_MAX there, which changes
    no finite value, so it is left unclamped here)."""
    names = [glob["mm_input_proj"]] + [layer[r] for layer in layers for r in _CLIPPABLE_LAYER_ROLES if layer[r]]
    clamps: dict[str, tuple[float, float, float, float]] = {}
    with open(gguf.path, "rb") as f:
        for name in names:
            stem = name[:-len(".weight")] if name.endswith(".weight") else name
            if not any(stem + suffix in gguf.tensors for suffix, _ in _CLAMP_SUFFIXES):
                continue
            lo_in, hi_in, lo_out, hi_out = (_scalar(gguf, f, stem + suffix, default)
                                            for suffix, default in _CLAMP_SUFFIXES)
            values = (lo_in, hi_in, lo_out, hi_out)
            if not (values[0] <= values[1] and values[2] <= values[3]):
                raise ModelShapeError(f"{gguf.path}: the clamps of {name!r} are empty ranges: {values}")
            clamps[name] = values
    return clamps


def _scalar(gguf: GGUFFile, f, name: str, default: float) -> float:
    """A one-value F32 tensor's value (clip.cpp's get_scalar), or ``default`` where absent."""
    info = gguf.tensors.get(name)
    if info is None:
        return default
    if info.n_elements != 1 or info.type_name != "F32" or info.shard:
        raise ModelShapeError(f"{gguf.path}: tensor {name!r} must be one F32 value, is {info.type_name} "
                              f"{list(info.shape)}")
    f.seek(gguf.data_offset + info.offset)
    value = struct.unpack("<f", f.read(4))[0]
    if math.isnan(value):
        raise ModelShapeError(f"{gguf.path}: tensor {name!r} is NaN")
    return float(value)
