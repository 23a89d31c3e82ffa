"""An agent's conversation, turn after turn: each turn evaluates only what is
new, on hybrid models too, whose recurrent state cannot be cut back.

A turn's prompt is the last one, the answer without its first tokens (a chat
template that strips the reasoning from history, as Qwen3.5's does: the
prompt parts from what the cache holds right where the last prompt ended),
and a new message.  Turn lengths are odd, off every alignment grid."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import elelem
from synthetic import TinyConfig
from test_hybrid import _rss_bytes

MODELS = {
    "qwen35": TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=11),
    "qwen35moe": TinyConfig(arch="qwen35moe", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=12),
    "gemma4": TinyConfig(arch="gemma4", n_embd=64, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16,
                         n_swa=16, n_layer=4, wtype="q8_0", seed=13),
}
REASONING = 5       # the answer's first tokens, which the next prompt leaves out
TURNS = 5


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tiny_model):
    path, _ = tiny_model(MODELS[request.param])
    return request.param, path


@pytest.fixture(scope="module", params=[name for name in MODELS if name != "gemma4"])
def hybrid(request, tiny_model):
    """A hybrid model's file: what kept and parked states are for (gemma4's cache cuts back)."""
    path, _ = tiny_model(MODELS[request.param])
    return path


def _open(path, **kw):
    return elelem.LLM(path, n_threads=2, n_ctx=2048, kv_size=2048, amx=False, **kw)


def _tokens(rng, n):
    return rng.integers(1, 96, n).tolist()


def _turns(llm, session, first, sizes, seed, answer=12):
    """Run the loop: [(prompt, answer, prompt tokens evaluated)] for each turn."""
    rng = np.random.default_rng(seed)
    engine, out, prompt = llm.engine, [], first
    for size in sizes:
        before = engine.prompt_tokens_evaluated
        reply = session.generate_tokens(prompt, answer)
        out.append((prompt, reply, engine.prompt_tokens_evaluated - before))
        prompt = prompt + reply[REASONING:] + _tokens(rng, size)
    return out


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_each_turn_evaluates_only_its_new_tokens_and_answers_as_a_fresh_run(model, speculative):
    arch, path = model
    sizes = [201, 37, 150, 9][:TURNS - 1]
    with _open(path, speculative=speculative) as llm:
        turns = _turns(llm, llm.new_session(), _tokens(np.random.default_rng(1), 303), sizes, seed=2)
        replayed = llm.engine.context.n_replayed
    for (prompt, reply, evaluated), (previous, last_reply, _) in zip(turns[1:], turns):
        new = len(prompt) - len(previous)
        if arch == "gemma4":   # a cache that cuts back: a prefix on the 4-grid, a tail for the last step's kernel
            assert new <= evaluated <= new + 64, (arch, new, evaluated)
        else:                  # from the kept state, as it is
            assert evaluated == new, (arch, new, evaluated)
    assert replayed == 0 or speculative   # kept drafts are replayed after a rollback, never the history
    for prompt, reply, _ in turns:
        with _open(path, speculative=False) as fresh:
            assert fresh.generate_tokens(prompt, len(reply)) == reply, arch


def test_a_conversation_resumes_after_another_took_its_sequence(hybrid):
    path = hybrid
    rng = np.random.default_rng(3)
    a, b = _tokens(rng, 250), _tokens(rng, 180)
    with _open(path, speculative=False, n_seq_max=1) as llm:
        engine = llm.engine
        session = llm     # its default session, on the one sequence
        a_reply = session.generate_tokens(a, 10)
        session.generate_tokens(b, 10)               # another conversation, on the one sequence
        assert len(engine.states) >= 2               # a's whole state and its prompt end (and checkpoint), parked
        turn = a + a_reply[REASONING:] + _tokens(rng, 41)
        before = engine.prompt_tokens_evaluated
        reply = session.generate_tokens(turn, 8)
        assert engine.prompt_tokens_evaluated - before == len(turn) - len(a)
        assert engine.states.loaded == 1
        # b comes back too: its prompt end and its answer were parked in turn
        b_turn = b + _tokens(rng, 20)
        before = engine.prompt_tokens_evaluated
        session.generate_tokens(b_turn, 4)
        assert engine.prompt_tokens_evaluated - before == 20
    with _open(path, speculative=False) as fresh:
        assert fresh.generate_tokens(turn, 8) == reply


def test_the_state_budget_evicts_least_recently_used_first(hybrid):
    path = hybrid
    rng = np.random.default_rng(4)
    with _open(path, speculative=False, n_seq_max=1, state_cache_mb=1) as llm:
        engine, ctx = llm.engine, llm.engine.context
        one = ctx.cache.state_bytes + 300 * ctx.cache.bytes_per_cell   # what parking a 300-token prompt costs
        engine.states.max_bytes = 5 * one // 2        # room for two parked states and little more
        session = llm
        prompts = [_tokens(rng, 300) for _ in range(4)]
        for p in prompts:
            session.generate_tokens(p, 2)
            assert engine.states.used <= engine.states.max_bytes
        assert engine.states.parked >= 3 and len(engine.states) < engine.states.parked   # some were evicted
        # the latest ones are kept: the conversation before the last resumes, the first does not
        before = engine.prompt_tokens_evaluated
        session.generate_tokens(prompts[2] + [7, 8, 9], 2)
        assert engine.prompt_tokens_evaluated - before == 3
        before = engine.prompt_tokens_evaluated
        session.generate_tokens(prompts[0] + [7, 8, 9], 2)
        assert engine.prompt_tokens_evaluated - before == 303


def test_no_state_cache_keeps_no_snapshot(hybrid):
    path = hybrid
    rng = np.random.default_rng(5)
    with _open(path, speculative=False, n_seq_max=1, state_cache_mb=0) as llm:
        llm.generate_tokens(_tokens(rng, 100), 3)
        llm.generate_tokens(_tokens(rng, 100), 3)
        assert llm.engine.states.used == 0 and not llm.engine.context.kept_snapshots()


def test_the_prompt_cache_on_disk_holds_the_prompt_end(hybrid, tmp_path):
    path = hybrid
    rng = np.random.default_rng(6)
    first = _tokens(rng, 300)
    with _open(path, speculative=False, prompt_cache=tmp_path) as llm:
        reply = llm.generate_tokens(first, 10)
    turn = first + reply[REASONING:] + _tokens(rng, 30)
    with _open(path, speculative=False, prompt_cache=tmp_path) as llm:   # a later process
        before = llm.engine.prompt_tokens_evaluated
        answer = llm.generate_tokens(turn, 5)
        assert llm.engine.prompt_tokens_evaluated - before == len(turn) - len(first)
    with _open(path, speculative=False) as fresh:
        assert fresh.generate_tokens(turn, 5) == answer


def test_bad_state_cache_sizes_are_refused(model):
    _, path = model
    for bad in (-1, 1.5, "big", True):
        with pytest.raises(elelem.errors.InvalidArgumentError, match="state_cache_mb"):
            _open(path, state_cache_mb=bad)


def test_a_turn_that_rewrites_the_generation_prompt_resumes_from_the_checkpoint_before_it(hybrid):
    # Qwen3.5's template ends a prompt with "<|im_start|>assistant\n<think>\n" and renders
    # that turn as "<|im_start|>assistant\n" + the answer: the next prompt parts from the
    # last one two tokens before its end.  A snapshot kept at the prompt's checkpoint, a
    # tile before its end, saves all but those last positions.
    path = hybrid
    rng = np.random.default_rng(7)
    first = _tokens(rng, 450)
    with _open(path, speculative=False) as llm:
        engine = llm.engine
        reply = llm.generate_tokens(first, 6)
        turn = first[:-2] + reply + _tokens(rng, 30)
        before = engine.prompt_tokens_evaluated
        answer = llm.generate_tokens(turn, 6)
        new = len(turn) - (len(first) - 2)
        assert new < engine.prompt_tokens_evaluated - before <= new + 2 * 64
    with _open(path, speculative=False) as fresh:
        assert fresh.generate_tokens(turn, 6) == answer
    # the step that ends at the checkpoint changes no logit: a prompt split there, and whole
    with _open(path, speculative=False) as split, _open(path, speculative=False, state_cache_mb=0) as whole:
        assert split.engine._checkpoint(len(first), 0) > 0 and whole.engine._checkpoint(len(first), 0) == 0
        assert np.array_equal(split.new_session().prefill(first), whole.new_session().prefill(first))


def test_the_memory_kept_for_conversations_stays_within_the_budget(tiny_model):
    # States of 3.3 MB (Qwen3.5-4B's state heads at this depth): twenty
    # conversations taking one sequence in turn would park 200 MB of them.
    cfg = MODELS["qwen35"].but(ssm_d_state=128, ssm_dt_rank=16)
    path, _ = tiny_model(cfg)
    rng = np.random.default_rng(8)
    budget_mb = 24
    with _open(path, speculative=False, n_seq_max=1, state_cache_mb=budget_mb) as llm:
        state = llm.engine.context.cache.state_bytes
        assert state > 3e6
        llm.generate_tokens(_tokens(rng, 64), 2)   # warm: the graphs, the sequence's slots
        gc.collect()
        before = _rss_bytes()
        for _ in range(20):
            llm.generate_tokens(_tokens(rng, 64), 2)
            assert llm.engine.states.used <= budget_mb << 20
        grown = _rss_bytes() - before
        assert llm.engine.states.parked >= 20 and len(llm.engine.states) < 10   # evicted as it went
        assert grown < (budget_mb << 20) + 16e6, f"RSS grew by {grown / 1e6:.0f} MB over a {budget_mb} MB budget"
