"""Gemma 4's encoder (gemma4v) against a NumPy reference: its 2D RoPE (NeoX halves,
the second half through ggml_rope_set_offset), the clippable linears' clamps, the
column and row position tables, V normed, the pooling.  The embeddings themselves
are compared with libmtmd's, bit for bit, in tests/test_vision_gemma4.py."""
from __future__ import annotations

import numpy as np
import pytest

from elelem.model.projector import read_projector
from synthetic_mmproj import TinyProjector, write_projector

# Bounds that bind: an input clamp on a Q product, output clamps on an FFN's down, an input
# clamp on the final projection.
PROJ = TinyProjector(projector_type="gemma4v", n_embd=32, n_head=4, n_ff=64, n_layer=2, image_size=224,
                     patch_size=4, n_merge=2, n_embd_out=64, pos_size=64, seed=5,
                     clamps=(("v.blk.0.ffn_down", "output_max", 0.3), ("v.blk.0.ffn_down", "output_min", -0.3),
                             ("v.blk.1.attn_q", "input_min", -0.5), ("mm.input_projection", "input_max", 0.8)))


def test_the_references_rope_halves_are_neox_ropes_of_half_width():
    """The reference's RoPE against its definition: the first half of each head rotated
    as a NeoX RoPE of width d/2 by the column, the second half by the row."""
    from synthetic_mmproj import rope_2d_neox_halves
    rng = np.random.default_rng(0)
    d, base = 16, 100.0
    x = rng.standard_normal((5, 2, d))
    cols, rows = np.array([0, 1, 2, 0, 1]), np.array([0, 0, 0, 1, 1])

    def neox(v, pos):
        out, half = v.copy(), v.shape[-1] // 2
        for i in range(half):
            theta = pos[:, None] * base ** (-2.0 * i / v.shape[-1])
            a, b = v[..., i], v[..., i + half]
            out[..., i], out[..., i + half] = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
        return out

    want = np.concatenate([neox(x[..., :d // 2], cols), neox(x[..., d // 2:], rows)], axis=-1)
    np.testing.assert_allclose(rope_2d_neox_halves(x, cols, rows, base), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_gemma4v_encoder_matches_the_numpy_reference(tmp_path, flash_attn, tolerance=2e-3):
    """Within 2e-3 of the outputs' largest magnitude (measured: 6.4e-4 without flash
    attention, 1.4e-3 with; float32 summation, ggml's quick-GELU table, and with flash
    attention K and V in F16).  The clamps bind: the reference
    without them is off by far more than the tolerance; so is one whose RoPE halves take
    the row first.  A wide grid (6 x 4 tokens): columns and rows differ."""
    core = pytest.importorskip("elelem._core")
    import synthetic_mmproj as sm
    path = tmp_path / "gemma4v.gguf"
    weights = write_projector(path, PROJ)
    spec = read_projector(path)
    assert len(spec.clamps) == 3
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors, clamps=spec.clamps)
    side = PROJ.patch_size * PROJ.n_merge
    pixels = np.random.default_rng(2).uniform(0, 1, (3, side * 4, side * 6)).astype(np.float32)
    got = vm.encode(pixels, 2, flash_attn)
    want = sm.gemma4v_vit_reference(PROJ, weights, pixels)
    assert got.shape == want.shape == (24, 64)
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err <= tolerance, err
    unclamped = np.abs(got - sm.gemma4v_vit_reference(PROJ, weights, pixels, clamps=False)).max() / scale
    assert unclamped > 10 * tolerance, unclamped
    rope = sm.rope_2d_neox_halves
    try:
        sm.rope_2d_neox_halves = lambda x, cols, rows, base: rope(x, rows, cols, base)
        swapped = np.abs(got - sm.gemma4v_vit_reference(PROJ, weights, pixels)).max() / scale
    finally:
        sm.rope_2d_neox_halves = rope
    assert swapped > 10 * tolerance, swapped
    vm.close()
