"""Hybrid models (qwen35, qwen3next: Gated DeltaNet layers beside full
attention; lfm2, lfm2moe: short gated convolution layers beside attention;
nemotron_h, granitehybrid: Mamba-2 layers beside attention and FFN layers):
the recurrent state through everything the engine does --
batching, rewinding, forking, speculative decoding, saved states -- exact on
tiny synthetic models (tests/support/synthetic.py), each test once per architecture.
Their logits against llama.cpp are tests/test_arch_llamacpp.py's."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import elelem
from elelem.errors import InvalidArgumentError, ModelShapeError
from synthetic import TinyConfig
from synthetic_mamba2 import Mamba2Config

HYBRID = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=11)
# Qwen3-Next: grouped value heads, fused projections, experts, an MTP layer.
NEXT = TinyConfig(arch="qwen3next", head_dim=32, n_rot=8, n_layer=4, wtype="q8_0", seed=11)
# LFM2: convolution layers (C) and attention (A) as C C A C C A, its state the convolution's
# alone; LFM2 MoE with a leading dense layer and experts after it, Q8_0.
LFM2 = TinyConfig(arch="lfm2", head_dim=16, n_layer=6, wtype="q8_0", seed=11)
LFM2MOE = TinyConfig(arch="lfm2moe", head_dim=16, n_layer=4, layer_types="CACC", n_dense_lead=1, wtype="q8_0",
                     seed=11)
# Nemotron-H: Mamba-2 layers (M), an MLP (-) and attention (*) as M - M * M -, Q8_0; its state
# the convolution's and the scan's.
NEMOTRON_H = Mamba2Config(pattern="M-M*M-", wtype="q8_0", seed=11)
# Granite 4.0 H: Mamba-2 and attention, each followed by experts and a shared expert; Granite's scales.
GRANITE = Mamba2Config(arch="granitehybrid", pattern="MM*M", ssm_n_head=16, ssm_n_group=1, n_ff=32, wtype="q8_0",
                       seed=11)
HYBRIDS = {"qwen35": HYBRID, "qwen3next": NEXT, "lfm2": LFM2, "lfm2moe": LFM2MOE, "nemotron_h": NEMOTRON_H,
           "granitehybrid": GRANITE}


@pytest.fixture(scope="module", params=list(HYBRIDS))
def hybrid_cfg(request):
    return HYBRIDS[request.param]


@pytest.fixture(scope="module")
def hybrid(tiny_model, hybrid_cfg):
    path, _ = tiny_model(hybrid_cfg)
    return path


def _open(path, **kw):
    return elelem.LLM(path, n_threads=2, n_seq_max=4, kv_size=512, amx=False, **kw)


def _prompt(seed, n):
    return np.random.default_rng(seed).integers(1, HYBRID.n_vocab, n).tolist()


def _alone(ctx, tokens, seq=0):
    """Logits of every position of ``tokens`` on a fresh sequence: the prompt, then one token a step."""
    ctx.seq_rm(seq, 0)
    rows = [ctx.decode(tokens[:5], [seq] * 5, True)]
    rows += [ctx.decode([t], [seq], True, decode_kernels=True) for t in tokens[5:]]
    ctx.seq_rm(seq, 0)
    return np.concatenate(rows)


def test_the_state_lives_in_slots_beside_the_cells(hybrid):
    with _open(hybrid) as llm:
        cache = llm.engine.context.cache
        assert cache.hybrid and cache.state_bytes > 0
        # the size elelem info gives, from the architecture's declaration
        assert sum(llm.spec.recurrent_state_bytes().values()) == cache.state_bytes
        assert not np.any(cache.recurrent_state(0))
        llm.engine.context.decode([1, 2, 3], [0, 0, 0])
        assert np.any(cache.recurrent_state(0)) and not np.any(cache.recurrent_state(1))
        llm.engine.context.seq_rm(0, 0)
        assert not np.any(cache.recurrent_state(0))


def _rss_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the RSS from /proc")
def test_the_store_takes_memory_for_the_sequences_used_not_for_n_seq_max(tiny_model):
    # Two slots of state are reserved for each of n_seq_max sequences, but a
    # slot's pages are touched only when its sequence first steps
    # (KVCache.ready_state): Qwen3.5-4B's 16 default sequences would otherwise
    # hold 1.6 GB of zeros, where llama.cpp's context holds its one sequence's.
    cfg = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=11,
                     ssm_d_state=128, ssm_dt_rank=16)
    path, _ = tiny_model(cfg)
    before = _rss_bytes()
    with elelem.LLM(path, n_threads=2, n_seq_max=32, kv_size=256, amx=False) as llm:
        ctx = llm.engine.context
        store = 2 * 32 * ctx.cache.state_bytes
        assert store > 150e6
        ctx.decode([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1])
        ctx.decode([7, 8], [0, 1], decode_kernels=True)
        grown = _rss_bytes() - before
        assert grown < store / 4, (grown, store)
        # a sequence never stepped reads as zeros; a stepped one as its state
        assert not np.any(ctx.cache.recurrent_state(5)) and np.any(ctx.cache.recurrent_state(1))

@pytest.mark.parametrize("amx", [False, None], ids=["no-amx", "amx-where-the-cpu-has-it"])
def test_sequences_stepping_together_get_their_solo_logits(hybrid, amx):
    # With AMX (None: where the CPU has it), ggml's AMX kernel takes ssm_out; a 3-D
    # product there (a step of several sequences) wrote past its output and aborted
    # in a later set_rows, so the recurrent layers project the step's tokens in 2-D.
    with elelem.LLM(hybrid, n_threads=2, n_seq_max=4, kv_size=512, amx=amx) as llm:
        ctx = llm.engine.context
        a, b = _prompt(1, 12), _prompt(2, 12)
        alone = [_alone(ctx, a), _alone(ctx, b)]
        # prompts of different lengths in one call (a step per count), then generated tokens interleaved
        ctx.decode(a[:5] + b[:7], [0] * 5 + [1] * 7, True)
        rows = {0: [], 1: []}
        for i in range(5, 12):
            tokens, seqs = ([a[i], b[i]], [0, 1]) if i >= 7 else ([a[i]], [0])
            out = ctx.decode(tokens, seqs, True, decode_kernels=True)
            for s, row in zip(seqs, out):
                rows[s].append(row)
        np.testing.assert_array_equal(np.array(rows[0]), alone[0][5:])
        np.testing.assert_array_equal(np.array(rows[1]), alone[1][7:])
        # interleaved rows in one step come back in the batch's order
        ctx.seq_rm(0, 0)
        ctx.seq_rm(1, 0)
        ctx.decode(a[:5], [0] * 5)
        ctx.decode(b[:5], [1] * 5)
        out = ctx.decode([a[5], b[5], a[6], b[6]], [0, 1, 0, 1], True, decode_kernels=True)
        np.testing.assert_array_equal(out[0::2], alone[0][5:7])
        np.testing.assert_array_equal(out[1::2], alone[1][5:7])


@pytest.mark.parametrize("order", [[2, 0, 3, 1], [3, 1, 2, 0], [1, 2, 0]])
def test_a_steps_rows_come_back_in_the_batchs_order_whatever_the_sequences_order(hybrid, order):
    # The recurrent layers take a step sequence after sequence, so the batch is
    # sorted by sequence and its rows put back.  A permutation that is not its
    # own inverse (a 3-cycle) once came back permuted: streams got each other's
    # logits (an engine lists its streams in the order they were admitted).
    with _open(hybrid) as llm:
        ctx = llm.engine.context
        prompts = {s: _prompt(20 + s, 5 + s) for s in order}
        tails = {s: _prompt(30 + s, 3) for s in order}
        alone = {}
        for s in order:
            alone[s] = [ctx.decode(prompts[s], [s] * len(prompts[s]))[0]]
            alone[s] += [ctx.decode([t], [s], decode_kernels=True)[0] for t in tails[s]]
            ctx.seq_rm(s, 0)
        # prompts of several counts in one call, listed in that order
        out = ctx.decode([t for s in order for t in prompts[s]], [s for s in order for _ in prompts[s]])
        for row, s in zip(out, order):
            np.testing.assert_array_equal(row, alone[s][0])
        for i in range(3):  # then one generated token each, a step at a time
            out = ctx.decode([tails[s][i] for s in order], order, decode_kernels=True)
            for row, s in zip(out, order):
                np.testing.assert_array_equal(row, alone[s][1 + i])


def test_a_rewind_restores_a_snapshot_or_evaluates_again_and_says_so(hybrid, caplog):
    with _open(hybrid) as llm:
        ctx = llm.engine.context
        tokens = _prompt(3, 20)
        want = _alone(ctx, tokens)
        ctx.decode(tokens[:5], [0] * 5)
        for t in tokens[5:14]:
            ctx.decode([t], [0], decode_kernels=True)
        ctx.decode(tokens[14:18], [0] * 4, decode_kernels=True)   # verified guesses: a snapshot before them
        before = ctx.n_replayed
        ctx.seq_rm(0, 15)                                         # keep one of them: from the snapshot at 14
        assert ctx.n_replayed - before == 1
        np.testing.assert_array_equal(ctx.decode([tokens[15]], [0], True, decode_kernels=True), want[15:16])
        with caplog.at_level(logging.INFO, logger="elelem"):
            ctx.seq_rm(0, 9)                                      # no snapshot at 9: from the one at 5
        assert "evaluating positions 5..8 again" in caplog.text
        out = [ctx.decode([t], [0], True, decode_kernels=True) for t in tokens[9:20]]
        np.testing.assert_array_equal(np.concatenate(out), want[9:20])
        with pytest.raises(InvalidArgumentError, match="through its Context"):
            ctx.cache.seq_rm(0, 3)


def test_a_fork_copies_the_state_whole_or_from_a_snapshot(hybrid):
    with _open(hybrid) as llm:
        ctx = llm.engine.context
        tokens = _prompt(4, 16)
        want = _alone(ctx, tokens)
        ctx.decode(tokens[:5], [0] * 5)
        for t in tokens[5:10]:
            ctx.decode([t], [0], decode_kernels=True)
        ctx.seq_cp(0, 1)                  # whole
        ctx.seq_cp(0, 2, 7)               # a prefix: from the snapshot at 5, two tokens again
        np.testing.assert_array_equal(ctx.decode([tokens[10]], [1], True, decode_kernels=True), want[10:11])
        np.testing.assert_array_equal(ctx.decode([tokens[7]], [2], True, decode_kernels=True), want[7:8])


def test_a_step_of_several_counts_may_want_rows_of_one_sequence_only(hybrid):
    # A prompt chunk short of its prompt's end wants no row: its sequence's
    # own step (one per count) still runs, and returns nothing.
    a, b = _prompt(50, 6), _prompt(51, 3)
    with _open(hybrid) as llm:
        ctx = llm.engine.context
        want_a = ctx.decode(a, [0] * 6)
        ctx.decode(b, [1] * 3)
        want_b = ctx.decode([7], [1])
        ctx.seq_rm(0, 0)
        ctx.seq_rm(1, 0)
        got_a = ctx.decode(a + b, [0] * 6 + [1] * 3, [False] * 5 + [True] + [False] * 3)
        np.testing.assert_array_equal(got_a, want_a)
        np.testing.assert_array_equal(ctx.decode([7], [1]), want_b)


def test_a_failed_step_leaves_every_state_as_it_was(hybrid):
    from elelem.errors import KVCacheFullError

    with elelem.LLM(hybrid, n_threads=2, n_seq_max=2, kv_size=256, amx=False) as llm:
        ctx = llm.engine.context
        ctx.decode([1, 2, 3, 4, 5], [0] * 5)
        state = ctx.cache.recurrent_state(0)
        # Two token counts: seq 0's step runs first, then seq 1's finds the cache full;
        # the first one is undone with it.
        with pytest.raises(KVCacheFullError):
            ctx.decode([6, 7] + [3] * 250, [0, 0] + [1] * 250)
        np.testing.assert_array_equal(ctx.cache.recurrent_state(0), state)
        assert ctx.cache.seq_length_of(0) == 5 and ctx.cache.seq_length_of(1) == 0
        assert not np.any(ctx.cache.recurrent_state(1))


def test_the_engine_reuses_a_prefix_only_as_far_as_a_snapshot_holds_its_state(hybrid):
    """A prefix is reused up to the sequence's latest snapshot at or before it
    (the end of a prompt, here) and the rest evaluated with the prompt, in its
    step: never replayed in a step of its own, whose other rounding would part
    the request from its fresh logits."""
    first = _prompt(40, 20)
    with _open(hybrid, speculative=False) as fresh:
        other = first[:10] + _prompt(41, 10)
        want_other = fresh.generate_tokens(other, 4)
    with _open(hybrid, speculative=False) as llm:
        ctx = llm.engine.context
        chat = llm.new_session()
        answer = chat.generate_tokens(first, 4)
        # another session sharing 10 positions, with no snapshot there: evaluated
        # whole, as a fresh one, not forked and replayed
        evaluated, replayed = ctx.n_evaluated, ctx.n_replayed
        assert llm.new_session().generate_tokens(other, 4) == want_other
        assert ctx.n_replayed == replayed and ctx.n_evaluated - evaluated == len(other) + 3
        # the chat's next turn, which keeps the answer, resumes where the sequence ends:
        # the answer's last token (picked, never evaluated) and the new turn are evaluated
        evaluated = ctx.n_evaluated
        turn = first + answer + _prompt(42, 8)
        chat.generate_tokens(turn, 2)
        held = len(first) + len(answer) - 1
        assert ctx.n_replayed == replayed and ctx.n_evaluated - evaluated == len(turn) - held + 1
        # one that rewrites the answer resumes where its first prompt ended, kept for it
        evaluated = ctx.n_evaluated
        turn = first + [answer[0] % 7 + 1] + _prompt(43, 8)
        chat.generate_tokens(turn, 2)
        assert ctx.n_replayed == replayed and ctx.n_evaluated - evaluated == len(turn) - len(first) + 1


def test_greedy_output_is_unchanged_by_prompt_lookup(hybrid):
    from elelem.engine.step_costs import StepCosts

    loopy = [5, 6, 7, 8, 9] * 4
    with _open(hybrid, speculative=False) as plain:
        # a prompt holding the model's own continuation, so that prompt lookup finds drafts
        prompt = loopy + plain.generate_tokens(loopy, 30) + loopy
        want = plain.generate_tokens(prompt, 30)
    with _open(hybrid, speculative=True) as fast:
        fast.engine.step_costs = StepCosts.flat()
        assert fast.generate_tokens(prompt, 30) == want
        # drafts were verified (a rollback to the snapshot before each verification and,
        # where some were kept, their replay), whatever the random weights accepted
        assert fast.engine.drafted_tokens > 0


def test_a_saved_state_carries_the_recurrent_state(hybrid, hybrid_cfg, tiny_model):
    with _open(hybrid) as llm:
        prompt = _prompt(5, 12)
        llm.eval(prompt)
        state = llm.save_state()
        want = llm.eval([7])
        llm.reset()
        llm.load_state(state)
        assert llm.engine.context.cache.seq_length_of(0) == len(prompt)
        np.testing.assert_array_equal(llm.eval([7]), want)
    other, _ = tiny_model(hybrid_cfg.but(seed=12))
    with _open(other) as llm2, pytest.raises(Exception):
        llm2.load_state(state)


@pytest.mark.parametrize("cfg, message", [
    (HYBRID.but(drop=("blk.1.ssm_conv1d.weight",)), r"required tensor 'blk\.1\.ssm_conv1d\.weight' is missing"),
    (HYBRID.but(extra_keys=(("{arch}.full_attention_interval", 3),)), r"full_attention_interval = 3 must divide"),
    (HYBRID.but(extra_keys=(("{arch}.ssm.inner_size", 48),)), r"ssm\.inner_size = 48 must be"),
    (NEXT.but(ssm_in=True, cut=(("blk.0.ssm_in.weight", 0, 120),)),
     r"tensor 'blk\.0\.ssm_in\.weight' \(ssm_in\) has shape \[64, 120\], expected \[64, 192\]"),
    (NEXT.but(cut=(("blk.2.ssm_ba.weight", 0, 4),)),
     r"tensor 'blk\.2\.ssm_ba\.weight' \(ssm_ba\) has shape \[64, 4\], expected \[64, 8\]"),
    (NEXT.but(drop=("blk.1.attn_gate.weight",)), r"required tensor 'blk\.1\.attn_gate\.weight' is missing"),
    (NEXT.but(drop=("blk.0.ffn_gate_inp_shexp.weight",)),
     r"required tensor 'blk\.0\.ffn_gate_inp_shexp\.weight' is missing"),
    (NEXT.but(n_nextn=0, extra_keys=(("{arch}.nextn_predict_layers", 5),)), r"nextn_predict_layers = 5 must be below"),
], ids=["no-conv", "interval", "inner-size", "next-ssm-in-width", "next-ssm-ba-width", "next-no-z",
        "next-no-shared-gate", "next-mtp-count"])
def test_a_broken_hybrid_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["step", "trim", "fork"]), st.integers(0, 1), st.integers(1, 4)),
                    min_size=3, max_size=10))
def test_interleaved_sequences_with_trims_and_forks_get_their_solo_logits(hybrid, ops):
    """Whatever happens between, each sequence's next logits are those of its
    tokens evaluated alone (one token a step after a 5-token prompt)."""
    with _open(hybrid) as llm:
        ctx = llm.engine.context
        held = {0: _prompt(6, 5), 1: _prompt(7, 5)}
        ctx.decode(held[0] + held[1], [0] * 5 + [1] * 5)
        rng = np.random.default_rng(len(ops))
        for op, seq, k in ops:
            if op == "step":
                new = {s: rng.integers(1, HYBRID.n_vocab, k).tolist() for s in (0, 1)}
                tokens = [t for s in (0, 1) for t in new[s]]
                ctx.decode(tokens, [0] * k + [1] * k, True, decode_kernels=True)
                for s in (0, 1):
                    held[s] += new[s]
            elif op == "trim" and len(held[seq]) - k >= 5:
                ctx.seq_rm(seq, len(held[seq]) - k)
                held[seq] = held[seq][:-k]
            elif op == "fork":
                other = 1 - seq
                ctx.seq_rm(other, 0)
                ctx.seq_cp(seq, other)
                held[other] = list(held[seq])
        probe = 17
        got = ctx.decode([probe, probe], [0, 1], True, decode_kernels=True)
        for s in (0, 1):
            ctx2 = llm.engine.context
            want = _alone_last(ctx2, held[s] + [probe], seq=3)
            np.testing.assert_array_equal(got[s], want)


def _alone_last(ctx, tokens, seq):
    ctx.seq_rm(seq, 0)
    ctx.decode(tokens[:5], [seq] * 5)
    row = None
    for t in tokens[5:]:
        row = ctx.decode([t], [seq], True, decode_kernels=True)[0]
    ctx.seq_rm(seq, 0)
    return row
