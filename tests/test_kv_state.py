"""One sequence's K and V read out of the cache and loaded back (the
native half of saved states and the prompt cache), on tiny synthetic models.

A loaded prefix must be bit-for-bit the prefix that was read: the next
token's logits after it are compared exactly with those of the sequence it
came from, in every K/V layout (V per cell with flash attention, V
transposed without), for quantized types, and when the cells it came from or
goes to are scattered by other sequences.
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem._core import new_context
from elelem.errors import InvalidArgumentError, InvalidTokenError, KVCacheFullError
from synthetic import TinyConfig

PROMPT = [3, 17, 42, 9, 5, 77, 12, 8, 30, 61, 2, 19]


@pytest.fixture(scope="module")
def model(tiny_model):
    path, _ = tiny_model(TinyConfig(head_dim=32))  # q8_0 and q4_0 store blocks of 32 values
    llm = elelem.LLM(path, kv_type="f32", n_threads=1)
    yield llm._model
    llm.close()


def context(model, kv_type="f16", flash_attn=False, type_v=None, kv_size=64):
    return new_context(model, kv_size, 32, 1, kv_type, flash_attn, 4, type_v)


LAYOUTS = [("f32", False, None), ("f16", False, None), ("f16", True, None), ("q8_0", True, "q8_0"),
           ("q4_0", True, "f16")]


@pytest.mark.parametrize("kv_type, flash_attn, type_v", LAYOUTS)
def test_a_loaded_state_continues_exactly_as_the_original(model, kv_type, flash_attn, type_v):
    ctx = context(model, kv_type, flash_attn, type_v)
    ctx.decode(PROMPT, 0)
    state = ctx.seq_state(0)
    assert state.dtype == np.uint8 and state.size == len(PROMPT) * ctx.cache.bytes_per_cell
    fresh = context(model, kv_type, flash_attn, type_v)
    fresh.seq_load(1, PROMPT, state)
    assert fresh.cache.seq_tokens(1) == PROMPT
    expected = ctx.decode([50], 0)[0]
    np.testing.assert_array_equal(fresh.decode([50], 1)[0], expected)
    # Loaded behind another sequence's cells, it is the same state in other cells:
    # attention then sums its terms in another order (rounding only).
    crowded = context(model, kv_type, flash_attn, type_v)
    crowded.decode([1, 2, 3], 2)
    crowded.seq_load(1, PROMPT, state)
    assert crowded.seq_state(1, len(PROMPT)).tobytes() == state.tobytes()
    got = crowded.decode([50], 1)[0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("flash_attn", [False, True])
def test_a_prefix_of_a_state_loads_alone(model, flash_attn):
    ctx = context(model, flash_attn=flash_attn)
    ctx.decode(PROMPT, 0)
    state = ctx.seq_state(0)
    m = 7
    other = context(model, flash_attn=flash_attn)
    other.seq_load(0, PROMPT[:m], state, stored=len(PROMPT))
    reference = context(model, flash_attn=flash_attn)
    reference.decode(PROMPT[:m], 0)
    assert other.seq_state(0).tobytes() == reference.seq_state(0).tobytes()
    np.testing.assert_array_equal(other.decode(PROMPT[m:m + 2], 0), reference.decode(PROMPT[m:m + 2], 0))


def test_a_state_read_from_scattered_cells_is_in_position_order(model):
    ctx = context(model)
    # Interleave two sequences so that sequence 0's cells are 0, 2, 4, ...
    for a, b in zip(PROMPT, reversed(PROMPT)):
        ctx.decode([a, b], [0, 1])
    solo = context(model)
    solo.decode(PROMPT, 0)
    # Batches of two run other kernels than one batch of twelve: same layout,
    # rounding-level differences only.
    scattered = np.frombuffer(ctx.seq_state(0).tobytes(), dtype=np.float16)
    packed = np.frombuffer(solo.seq_state(0).tobytes(), dtype=np.float16)
    np.testing.assert_allclose(scattered.astype(np.float32), packed.astype(np.float32), atol=2e-2, rtol=2e-2)


def test_bad_loads_are_refused_and_leave_the_cache_as_it_was(model):
    ctx = context(model)
    ctx.decode(PROMPT, 0)
    state = ctx.seq_state(0)
    target = context(model, kv_size=8)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        target.seq_load(0, PROMPT[:4], state[:-1], stored=len(PROMPT))
    with pytest.raises(InvalidArgumentError, match="cannot give"):
        target.seq_load(0, PROMPT, state, stored=4)
    with pytest.raises(InvalidTokenError):
        target.seq_load(0, [10 ** 6] * len(PROMPT), state)
    with pytest.raises(KVCacheFullError):
        target.seq_load(0, PROMPT, state)       # 12 positions, 8 cells
    assert target.cache.n_used == 0 and target.cache.seq_length_of(0) == 0
    target.decode([1], 0)
    with pytest.raises(InvalidArgumentError, match="empty sequence"):
        target.seq_load(0, PROMPT[:2], state[:2 * ctx.cache.bytes_per_cell])
    other_layout = context(model, flash_attn=True, type_v="q8_0")
    with pytest.raises(InvalidArgumentError, match="bytes"):
        other_layout.seq_load(0, PROMPT, state)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        ctx.seq_state(0, len(PROMPT) + 1)


def test_an_empty_state_is_empty(model):
    ctx = context(model)
    assert ctx.seq_state(0).size == 0
    ctx.seq_load(0, [], b"")
    assert ctx.cache.seq_length_of(0) == 0
