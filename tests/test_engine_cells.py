"""The KV cache's cells and batched steps, on tiny synthetic models.

Property tests (hypothesis): sequences interleaved in one batch -- with
forks, trims and cancels in the middle -- each get the logits they get
alone, and the cell allocator never leaks or double-books a cell.

Tolerance: a sequence stepped alone fills cells 0, 1, 2, ... in order; in a
shared cache its cells are wherever they were free, so attention sums the
same terms in another order, and a batch of several sequences runs other
matmul kernels (gemm rather than gemv).  Both change float32 rounding only:
logits agree within 1e-4 of their largest magnitude (the measured gap on these
models is ~1e-6).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import elelem
from elelem.errors import InvalidArgumentError, KVCacheFullError
from synthetic import TinyConfig

KV_SIZE = 96
N_SEQ = 4
CONFIGS = {
    "qwen2": TinyConfig(),
    # sliding window and a global layer: the windowed mask comes from the cells too
    "gemma3": TinyConfig(arch="gemma3", head_dim=32, n_layer=3, n_swa=5, tied=True),
}
HYPOTHESIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request, tiny_model):
    path, _ = tiny_model(CONFIGS[request.param])
    llm = elelem.LLM(path, kv_type="f32", n_threads=1)
    yield llm._model
    llm.close()


def fresh_context(model, kv_size=KV_SIZE):
    return elelem._core.new_context(model, kv_size, 64, 1, "f32", False, N_SEQ)


def alone(model, tokens):
    """The last logits of ``tokens`` evaluated by themselves in a fresh cache."""
    context = fresh_context(model)
    try:
        return context.decode(tokens, 0)[0].copy()
    finally:
        context.close()


def check_cells(context, expected):
    """Every sequence holds exactly positions 0..n-1, each in one cell, with
    the tokens we fed it; free cells are empty; nothing is counted twice."""
    pos, token, seqs = context.cache.cell_table()
    used = seqs != 0
    assert context.cache.n_used == int(used.sum())
    assert (pos[~used] == -1).all()
    for s in range(N_SEQ):
        mine = (seqs & np.uint64(1 << s)) != 0
        want = expected.get(s, [])
        assert sorted(pos[mine].tolist()) == list(range(len(want))), f"sequence {s}: positions double-booked or lost"
        assert context.cache.seq_tokens(s) == want
        assert context.cache.seq_length_of(s) == len(want)


tokens_strategy = st.lists(st.integers(0, 95), min_size=1, max_size=12)


@HYPOTHESIS
@given(prompts=st.lists(tokens_strategy, min_size=2, max_size=N_SEQ), data=st.data())
def test_interleaved_sequences_get_the_logits_they_get_alone(model, prompts, data):
    context = fresh_context(model)
    try:
        pending = {s: list(p) for s, p in enumerate(prompts)}
        fed = {s: [] for s in pending}
        last = {}
        while any(pending.values()):
            # a batch: a random chunk of each sequence that still has tokens, in random order
            order = data.draw(st.permutations([s for s in pending if pending[s]]))
            tokens, seqs = [], []
            for s in order:
                n = data.draw(st.integers(1, len(pending[s])))
                tokens += pending[s][:n]
                seqs += [s] * n
                fed[s] += pending[s][:n]
                del pending[s][:n]
            out = context.decode(tokens, seqs)
            for row, s in zip(out, sorted(set(seqs), key=lambda s: max(i for i, x in enumerate(seqs) if x == s))):
                last[s] = row
        check_cells(context, fed)
        for s, prompt in enumerate(prompts):
            want = alone(model, prompt)
            np.testing.assert_allclose(last[s], want, rtol=0, atol=1e-4 * np.abs(want).max())
    finally:
        context.close()


@HYPOTHESIS
@given(prefix=tokens_strategy, tails=st.lists(tokens_strategy, min_size=2, max_size=3),
       trim=st.integers(0, 12), data=st.data())
def test_forks_and_trims_keep_every_sequence_exact(model, prefix, tails, trim, data):
    """A shared prefix is evaluated once and forked; a sequence trimmed and
    refilled, or cancelled (cleared) mid-way, leaves the others exact."""
    context = fresh_context(model)
    try:
        context.decode(prefix, 0)
        for s in range(1, len(tails)):
            context.cache.seq_cp(0, s, data.draw(st.integers(0, len(prefix))))
        expected = {s: context.cache.seq_tokens(s) for s in range(len(tails))}
        assert expected[0] == list(prefix)
        # trim sequence 0, then every sequence appends its tail in one batch
        keep = min(trim, len(prefix))
        context.cache.seq_rm(0, keep)
        expected[0] = expected[0][:keep]
        tokens, seqs = [], []
        for s, tail in enumerate(tails):
            tokens += tail
            seqs += [s] * len(tail)
            expected[s] = expected[s] + list(tail)
        out = context.decode(tokens, seqs)
        check_cells(context, expected)
        for s in range(len(tails)):
            want = alone(model, expected[s])
            np.testing.assert_allclose(out[s], want, rtol=0, atol=1e-4 * np.abs(want).max())
        # cancelling a sequence frees its cells; the shared ones stay for the others
        victim = data.draw(st.integers(0, len(tails) - 1))
        context.cache.seq_rm(victim, 0)
        expected[victim] = []
        check_cells(context, expected)
        for s in range(len(tails)):
            context.cache.seq_rm(s, 0)
        assert context.cache.n_used == 0
    finally:
        context.close()


OPS = st.lists(st.one_of(
    st.tuples(st.just("decode"), st.lists(st.tuples(st.integers(0, N_SEQ - 1), st.integers(0, 95)),
                                          min_size=1, max_size=20)),
    st.tuples(st.just("trim"), st.integers(0, N_SEQ - 1), st.integers(0, 40)),
    st.tuples(st.just("fork"), st.integers(0, N_SEQ - 1), st.integers(0, N_SEQ - 1), st.integers(0, 40)),
), max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_the_cell_allocator_never_leaks_or_double_books(model, ops):
    context = fresh_context(model, kv_size=48)
    expected: dict[int, list[int]] = {}
    try:
        for op in ops:
            if op[0] == "decode":
                pairs = op[1]
                if context.cache.n_free < len(pairs):
                    with pytest.raises(KVCacheFullError):
                        context.decode([t for _, t in pairs], [s for s, _ in pairs])
                    continue  # a refused step changes nothing
                context.decode([t for _, t in pairs], [s for s, _ in pairs])
                for s, t in pairs:
                    expected.setdefault(s, []).append(t)
            elif op[0] == "trim":
                _, s, n = op
                if n > len(expected.get(s, [])):
                    with pytest.raises(InvalidArgumentError):
                        context.cache.seq_rm(s, n)
                    continue
                context.cache.seq_rm(s, n)
                expected[s] = expected.get(s, [])[:n]
            else:
                _, src, dst, n = op
                if src == dst or expected.get(dst) or n > len(expected.get(src, [])):
                    with pytest.raises(InvalidArgumentError):
                        context.cache.seq_cp(src, dst, n)
                    continue
                context.cache.seq_cp(src, dst, n)
                expected[dst] = expected.get(src, [])[:n]
            check_cells(context, expected)
        for s in range(N_SEQ):
            context.cache.seq_rm(s, 0)
        assert context.cache.n_used == 0 and context.cache.n_free == 48
    finally:
        context.close()


def test_bad_batches_are_refused_and_change_nothing(model):
    context = fresh_context(model)
    try:
        context.decode([1, 2, 3], 0)
        for tokens, seqs, outputs in [([1], [N_SEQ], None), ([1, 2], [0], None), ([96], [0], None),
                                      ([1], [-1], None), (list(range(65)), [0] * 65, None),
                                      ([1, 2], [0, 0], [False, False]), ([1], [0], [True, True])]:
            with pytest.raises((InvalidArgumentError, elelem.errors.InvalidTokenError)):
                context.decode(tokens, seqs, outputs)
        check_cells(context, {0: [1, 2, 3]})
    finally:
        context.close()


def test_a_full_cache_refuses_a_step_whole(model):
    context = fresh_context(model, kv_size=8)
    try:
        context.decode([1] * 6, 0)
        with pytest.raises(KVCacheFullError, match="2 free cells"):
            context.decode([1, 2, 3], [1, 1, 1])
        check_cells(context, {0: [1] * 6})
        context.decode([1, 2], [1, 1])
        assert context.cache.n_free == 0
    finally:
        context.close()


@pytest.mark.real_model
def test_a_request_that_cannot_fit_waits_for_the_running_one(smollm_path):
    """With cells for one request at a time, a second one waits for the first
    to end (neither is cut short)."""
    with elelem.LLM(smollm_path, n_ctx=64, kv_size=64, n_threads=1) as llm:
        first, second = llm.new_session(), llm.new_session()
        never_end = {t: -1e9 for t in llm.tokenizer.eog_ids}
        prompt_a = llm.tokenize("The history of the Roman empire, in short: it")
        prompt_b = llm.tokenize("A list of prime numbers: 2, 3, 5, 7,")
        want_a = first.generate(prompt_a, max_tokens=24, temperature=0, logit_bias=never_end)
        want_b = second.generate(prompt_b, max_tokens=24, temperature=0, logit_bias=never_end)
        first.reset(), second.reset()
        a = first.stream(prompt_a, max_tokens=24, temperature=0, logit_bias=never_end)
        b = second.stream(prompt_b, max_tokens=24, temperature=0, logit_bias=never_end)
        head_a = next(a)  # `a` is admitted and holds its cells
        assert len(prompt_a) + len(prompt_b) + 48 > 64  # not both at once
        got_b = b.text()  # waits for `a`'s cells, driving `a` meanwhile
        assert head_a + a.text() == want_a and got_b == want_b
        assert a.completion_tokens == b.completion_tokens == 24
        # One request alone always fits (n_ctx <= kv_size); past n_ctx it is refused up front.
        assert 0 < len(llm.new_session().generate_tokens(list(range(1, 50)), 40)) <= 64 - 49 + 1  # the last is never evaluated
        with pytest.raises(elelem.errors.ContextLimitError):
            llm.new_session().generate_tokens(list(range(1, 70)), 4)


def test_a_sequences_new_cells_follow_the_cells_it_sees_on_the_grid(tiny_model):
    # Flash attention's one-row kernel goes over the cells in order (an online
    # softmax, one cell after another): a token placed in a free cell below its
    # own prefix would sum in another order than alone.  Its tiled kernel and
    # the softmax without it go over them in blocks of 64 and SIMD lanes: a
    # cell off its place in the block (index = position mod 64) would sum in
    # another lane.  So new cells go past the sequence's, on that grid.
    path, _ = tiny_model(TinyConfig(wtype="q8_0"))
    llm = elelem.LLM(path, n_threads=1)
    rng = np.random.default_rng(5)
    first, second = rng.integers(0, 96, 10).tolist(), rng.integers(0, 96, 12).tolist()

    def cells_of(context, seq):
        pos, _, seqs = context.cache.cell_table()
        mine = np.nonzero(seqs == 1 << seq)[0]
        return mine[np.argsort(pos[mine])].tolist()

    try:
        context = elelem._core.new_context(llm._model, KV_SIZE, 64, 1, "f16", True, N_SEQ)
        context.decode(first, 0)        # cells 0-9
        context.decode(second, 1)       # cells 64-75: position 0 where it would be alone, mod 64
        assert cells_of(context, 1) == list(range(64, 76))
        context.cache.seq_rm(0, 0)      # cells 0-9 free again
        got = context.decode([7], 1)[0]
        assert cells_of(context, 1) == list(range(64, 77))
        context.close()
        context = elelem._core.new_context(llm._model, KV_SIZE, 64, 1, "f16", True, N_SEQ)
        context.decode(second, 0)
        np.testing.assert_array_equal(got, context.decode([7], 0)[0])
        assert cells_of(context, 0) == list(range(13))  # a sequence alone fills 0, 1, 2, ... as llama.cpp does
        context.decode(first, 1)
        assert cells_of(context, 1) == list(range(64, 74))
        # Past the last block (64-95) no cell is free past them, on the grid or
        # off it: the lowest free one.  A grid too full is never a refusal.
        context.decode(rng.integers(0, 96, 30).tolist(), 1)
        cells = cells_of(context, 1)
        assert cells[:33] == list(range(64, 96)) + [13] and len(set(cells)) == 40
        context.close()
    finally:
        llm.close()


def test_a_lone_token_in_a_cache_other_sequences_grew_gets_its_logits_alone(tiny_model):
    # With one query row and 512 cells or more, ggml's flash attention splits
    # the cells between its threads and sums them otherwise.  A short
    # sequence alone never has that many cells, but in a cache that a long
    # one has filled (the last stream still running) it would: so its row is
    # taken twice, through the kernel it meets alone (graph/blocks.pxi,
    # _flash_attention_lone_row).
    path, _ = tiny_model(TinyConfig(wtype="q8_0"))
    llm = elelem.LLM(path, n_threads=2)
    rng = np.random.default_rng(11)
    short, long = rng.integers(0, 96, 20).tolist(), rng.integers(0, 96, 600).tolist()
    steps = [7, 8, 9, 10]
    try:
        context = elelem._core.new_context(llm._model, 1024, 320, 2, "f16", True, 2)
        context.decode(short, 0)
        context.decode(long[:300], 1)
        context.decode(long[300:], 1)
        shared = [context.decode([t], 0)[0].copy() for t in steps]
        context.close()
        context = elelem._core.new_context(llm._model, 1024, 320, 2, "f16", True, 2)
        context.decode(short, 0)
        for t, got in zip(steps, shared):
            np.testing.assert_array_equal(got, context.decode([t], 0)[0])
        context.close()
    finally:
        llm.close()
