"""Qwen3-VL images against llama.cpp's libmtmd, live, on the same files and pixels.

A synthetic qwen3vl projector (tests/support/synthetic_mmproj.py, the
converter's Qwen3VLVisionModel layout: a patch bias, a learned position table
resized to each image's grid, one Q/K/V product, and deepstack mergers on
layers 0 and 2) over synthetic qwen3vl and qwen3vlmoe text models
(interleaved M-RoPE, n_deepstack_layers 2) carrying SmolLM2's vocabulary; and
Qwen3.5's hybrids (qwen35, qwen35moe: Gated DeltaNet layers the image's rows
pass through) with the same projector less its deepstack mergers.
libmtmd's side is tests/support/fixtures/make_vision_fixtures.py.

Tolerance: none.  The encoder is clip_graph_qwen3vl op for op on the same
ggml, with flash attention and without; each embedding row holds the main
merger's output then the two deepstack parts, as mtmd hands them to the text
model.  After an image the text logits are compared bit for bit: the image's
rows take the 2D positions in interleaved M-RoPE, and deepstack part k is
added after layer k.  A NumPy reference of the text model checks those two
ops on their own (IMROPE's 2D positions, the deepstack add).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from image_inputs import floats as _floats, pixels as _pixels
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, _attend, _rms_norm, _rope_imrope, _silu, write_model
from synthetic_mmproj import TinyProjector, write_projector
from vocab_metadata import vocab_size, vocab_writer

N_DEEPSTACK = 2
PROJ = TinyProjector(projector_type="qwen3vl_merger", n_embd=32, n_head=4, n_ff=48, n_layer=4, patch_size=8,
                     image_size=64, n_embd_out=64, deepstack=(0, 2))
_TEXT = dict(n_vocab=49152, n_embd=64, n_head=4, n_head_kv=2, n_layer=4, tied=True,
             extra_keys=(("{arch}.n_deepstack_layers", N_DEEPSTACK),))
TEXT = {"qwen3vl": TinyConfig(arch="qwen3vl", **_TEXT),
        "qwen3vlmoe": TinyConfig(arch="qwen3vlmoe", n_ff_exp=32, **_TEXT),
        # Qwen3.5: a Gated DeltaNet hybrid; its mmproj is a qwen3vl_merger without deepstack layers.
        "qwen35": TinyConfig(arch="qwen35", **dict(_TEXT, extra_keys=())),
        "qwen35moe": TinyConfig(arch="qwen35moe", n_ff_exp=32, **dict(_TEXT, extra_keys=()))}
# The projector file each text model pairs with.
MMPROJ = {"qwen3vl": "mmproj.gguf", "qwen3vlmoe": "mmproj.gguf", "qwen35": "mmproj_plain.gguf",
          "qwen35moe": "mmproj_plain.gguf"}
# Odd sizes and extreme aspect ratios (the position table resized to each grid), and 64 x 64:
# the table's own 8 x 8 grid, taken as it is.
SIZES = [(37, 23), (5, 300), (300, 7), (64, 64), (150, 200)]
PROMPT = "<|im_start|>user\nWhat is in<__media__> this picture?<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [PROMPT, "<|im_start|>user\nCompare<__media__> with<__media__>.<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nNo picture here.<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    assert vocab_size(smollm_path) == TEXT["qwen3vl"].n_vocab
    tmp = tmp_path_factory.mktemp("vision_qwen3vl")
    stored = {arch: write_model(tmp / f"{arch}.gguf", cfg, extra_metadata=vocab_writer(smollm_path))
              for arch, cfg in TEXT.items()}
    write_projector(tmp / "mmproj.gguf", PROJ)
    write_projector(tmp / "mmproj_plain.gguf", PROJ.but(deepstack=()))
    images = []
    for h, w in SIZES:
        np.save(tmp / f"image_{h}x{w}.npy", _pixels(h, w))
        images.append(tmp / f"image_{h}x{w}.npy")
    return tmp, images, stored


@pytest.fixture(scope="module", params=[("qwen3vl", "on"), ("qwen3vl", "off"), ("qwen3vlmoe", "on"), ("qwen35", "on"),
                                        ("qwen35moe", "off")],
                ids=lambda p: f"{p[0]}-fa-{p[1]}")
def reference(request, llamacpp, files):
    tmp, images, _ = files
    arch, flash = request.param
    return arch, flash, llamacpp.vision(tmp / f"{arch}.gguf", tmp / MMPROJ[arch], images, PROMPTS, flash)


@pytest.mark.real_model
def test_image_embeddings_and_deepstack_features_equal_libmtmds(files, reference):
    from elelem.vision import Image, Projector

    arch, flash, ref = reference
    tmp, images, _ = files
    n_deepstack = 0 if arch.startswith("qwen35") else N_DEEPSTACK
    with Projector(tmp / MMPROJ[arch], n_threads=THREADS, flash_attn=flash == "on") as projector:
        assert projector.spec.n_deepstack == n_deepstack
        for path, record in zip(images, ref["images"]):
            got = projector.encode(Image.from_pixels(np.load(path)))
            want = _floats(record["embeddings"])
            assert got.embeddings.shape[1] == PROJ.n_embd_out * (1 + n_deepstack)
            assert got.embeddings.size == want.size, f"{path.name}: {got.embeddings.shape[0]} tokens, grid {got.grid}"
            diff = np.abs(got.embeddings.astype(np.float64).reshape(-1) - want)
            assert diff.max() == 0.0, f"{path.name} (flash attention {flash}): max |diff| {diff.max():.3g}"


def _prompt_ids(llm, record, images, kept=None) -> list[int]:
    """The prompt as mtmd_tokenize cut it, each image's ids from elelem's projector;
    ``kept`` gets (first row, embeddings, grid) of each image."""
    from elelem.vision import Image

    ids, k, n_pos = [], 0, 0
    for chunk in record["chunks"]:
        if "text" in chunk:
            ids += chunk["text"]
            n_pos += len(chunk["text"])
            continue
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[k])))
        k += 1
        assert chunk["image"] == embedded.n_tokens
        if kept is not None:
            kept.append((len(ids), embedded.embeddings, embedded.grid))
        ids += llm.engine.media.add(embedded.digest, embedded.embeddings, embedded.grid)
        n_pos += max(embedded.grid)
    assert record["n_past"] == n_pos
    return ids


def _open(files, arch, flash):
    import elelem

    tmp, _, _ = files
    llm = elelem.LLM(tmp / f"{arch}.gguf", mmproj=tmp / MMPROJ[arch], n_ctx=512, kv_type="f16", n_threads=THREADS,
                     speculative=False, **elelem_kernel_options())
    llm.images.projector.flash_attn = flash == "on"
    return llm


@pytest.mark.real_model
def test_logits_after_images_equal_llamacpps(files, reference):
    """One image, two, none: 2D positions in interleaved M-RoPE, deepstack parts
    added after the first layers; the last logits bit for bit."""
    arch, flash, ref = reference
    with _open(files, arch, flash) as llm:
        diffs = []
        for record in ref["prompts"]:
            llm.reset()
            logits = llm.prefill(_prompt_ids(llm, record, files[1]))
            diffs.append(np.abs(logits.astype(np.float64) - _floats(record["logits"])).max())
        assert max(diffs) == 0.0, diffs


@pytest.mark.real_model
def test_greedy_tokens_after_an_image_equal_llamacpps(files, reference):
    arch, flash, ref = reference
    record = ref["prompts"][0]
    with _open(files, arch, flash) as llm:
        ids = _prompt_ids(llm, record, files[1])
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy
        assert llm.generate_tokens(ids, len(record["greedy"])) == greedy


@pytest.mark.real_model
def test_a_reused_prefix_keeps_the_images_positions_and_deepstack(files, reference):
    """The two-image prompt in two requests, the second reusing the first's cells
    (images included): llama.cpp's logits."""
    arch, flash, ref = reference
    record = ref["prompts"][1]
    with _open(files, arch, flash) as llm:
        ids = _prompt_ids(llm, record, files[1])
        llm.prefill(ids[:len(ids) - 3])
        evaluated = llm.engine.media.images_evaluated
        logits = llm.prefill(ids)
        assert llm.engine.media.images_evaluated == evaluated
        assert np.abs(logits.astype(np.float64) - _floats(record["logits"])).max() == 0.0


# -- the NumPy reference of the text side: IMROPE's 2D positions and the deepstack add --------------------

def mtmd_positions4(ids: list[int], images: list[tuple[int, np.ndarray, tuple[int, int]]]) -> np.ndarray:
    """(4, n): a text token's position in t, h, w; an image of nx x ny at pos_0 gives its
    row k (pos_0, pos_0 + k // nx, pos_0 + k % nx, 0), and the next token pos_0 + max(nx, ny)
    (mtmd_image_tokens_get_decoder_pos, mtmd_image_tokens_get_n_pos)."""
    pos = np.zeros((4, len(ids)))
    starts = {start: (len(rows), grid) for start, rows, grid in images}
    i = p = 0
    while i < len(ids):
        if i in starts:
            n, (nx, ny) = starts[i]
            k = np.arange(n)
            pos[0, i:i + n], pos[1, i:i + n], pos[2, i:i + n] = p, p + k // nx, p + k % nx
            i, p = i + n, p + max(nx, ny)
            continue
        pos[:3, i] = p
        i, p = i + 1, p + 1
    return pos


def qwen3vl_reference_logits(w: dict[str, np.ndarray], cfg: TinyConfig, ids: list[int],
                             images: list[tuple[int, np.ndarray, tuple[int, int]]],
                             pos4: np.ndarray | None = None) -> np.ndarray:
    """The dense qwen3vl text model in float64: an image row's first n_embd values in
    place of the token, its part k + 1 added to the hidden state after layer k; the
    positions mtmd's (mtmd_positions4) unless given."""
    n, e, hd = len(ids), cfg.n_embd, cfg.hd
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = w["token_embd.weight"][np.maximum(np.asarray(ids), 0)]
    extra = np.zeros((N_DEEPSTACK, n, e))
    for start, rows, _ in images:
        x[start:start + len(rows)] = rows[:, :e]
        for k in range(N_DEEPSTACK):
            extra[k, start:start + len(rows)] = rows[:, (k + 1) * e:(k + 2) * e]
    pos4 = mtmd_positions4(ids, images) if pos4 is None else pos4
    causal = np.tril(np.ones((n, n), dtype=bool))
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = _rms_norm((h @ w[p + "attn_q.weight"].T).reshape(n, cfg.n_head, hd), w[p + "attn_q_norm.weight"],
                      cfg.rms_eps)
        k = _rms_norm((h @ w[p + "attn_k.weight"].T).reshape(n, cfg.n_head_kv, hd), w[p + "attn_k_norm.weight"],
                      cfg.rms_eps)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, cfg.n_head_kv, hd)
        q = _rope_imrope(q, pos4, cfg.rope_base, cfg.rot, cfg.rope_sections)
        k = _rope_imrope(k, pos4, cfg.rope_base, cfg.rot, cfg.rope_sections)
        x = x + _attend(q, k, v, causal, 1.0 / math.sqrt(hd)).reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = _rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        x = x + (_silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        if i < N_DEEPSTACK:
            x = x + extra[i]
    return _rms_norm(x, w["output_norm.weight"], cfg.rms_eps) @ w["token_embd.weight"].T


@pytest.mark.real_model
def test_the_text_model_matches_the_numpy_reference(files, tolerance=1e-3):
    """The logits of the last rows after two images, against qwen3vl_reference_logits,
    within 1e-3 of their largest magnitude (measured 1.5e-4: float32 sums and F16
    activations into the F16 weights).  Both new ops matter: the reference without
    the deepstack parts (0.36), or with the images' rows at sequential positions,
    is off by more."""
    tmp, images, stored = files
    cfg = TEXT["qwen3vl"]
    record = {"chunks": [{"text": [1, 2, 3]}, {"image": 0}, {"text": [4, 5]}, {"image": 0}, {"text": [6, 7, 8]}]}
    with _open(files, "qwen3vl", "on") as llm:
        kept: list = []
        ids = _ids_with_images(llm, record, images[:2], kept)
        ends = range(len(ids) - 2, len(ids) + 1)
        got = np.stack([llm.prefill(ids[:m]) for m in ends]).astype(np.float64)
    want = qwen3vl_reference_logits(stored["qwen3vl"], cfg, ids, kept)[[m - 1 for m in ends]]
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < tolerance * scale
    flat = [(s, np.concatenate([r[:, :cfg.n_embd], np.zeros_like(r[:, cfg.n_embd:])], axis=1), g) for s, r, g in kept]
    without = qwen3vl_reference_logits(stored["qwen3vl"], cfg, ids, flat)[[m - 1 for m in ends]]
    assert np.abs(got - without).max() > tolerance * scale
    sequential = np.zeros((4, len(ids)))
    sequential[:3] = np.arange(len(ids))
    flat_positions = qwen3vl_reference_logits(stored["qwen3vl"], cfg, ids, kept, sequential)[[m - 1 for m in ends]]
    assert np.abs(got - flat_positions).max() > tolerance * scale


def _ids_with_images(llm, record, images, kept) -> list[int]:
    from elelem.vision import Image

    ids, k = [], 0
    for chunk in record["chunks"]:
        if "text" in chunk:
            ids += chunk["text"]
            continue
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[k])))
        k += 1
        kept.append((len(ids), embedded.embeddings, embedded.grid))
        ids += llm.engine.media.add(embedded.digest, embedded.embeddings, embedded.grid)
    return ids
