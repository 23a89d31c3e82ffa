"""The persistent prompt cache and in-memory saved states.

On tiny synthetic models: a prompt sharing a stored prefix loads it instead
of evaluating it -- in a new LLM, as in a new process -- and gives the same
greedy tokens; the cache stays within its size, keeps the most recently
used entries, and ignores (with a warning) every file that is not a whole,
valid one of its own settings.  A fresh-process run on SmolLM2 is in
test_prompt_cache_process.py.
"""
from __future__ import annotations

import logging
import pickle
import threading

import numpy as np
import pytest

import elelem
from elelem.engine.prompt_cache import PromptCache
from elelem.engine.state_file import MAGIC, read_state_file, write_state_file
from elelem.errors import StateError
from synthetic import TinyConfig

rng = np.random.default_rng(7)
SYSTEM = rng.integers(1, 96, size=300).tolist()      # a long shared prefix
QUESTION_A = rng.integers(1, 96, size=20).tolist()
QUESTION_B = rng.integers(1, 96, size=25).tolist()
QUESTION_B[0] = QUESTION_A[0] % 95 + 1               # the questions differ from their first token


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model(TinyConfig())[0]


def open_llm(path, cache_dir=None, **kw):
    return elelem.LLM(path, n_ctx=1024, n_threads=1, speculative=False, prompt_cache=cache_dir, **kw)


def entries(folder):
    return sorted(p for p in folder.rglob("*.kvc"))


def test_a_new_llm_loads_the_shared_prefix_and_gives_the_same_tokens(model_path, tmp_path):
    with open_llm(model_path) as plain:
        expected = plain.generate_tokens(SYSTEM + QUESTION_B, 12)
    with open_llm(model_path, tmp_path) as first:
        first.generate_tokens(SYSTEM + QUESTION_A, 12)
    assert len(entries(tmp_path)) == 1                     # written, and flushed by close()
    with open_llm(model_path, tmp_path) as second:
        before = second.engine.context.n_evaluated
        got = second.generate_tokens(SYSTEM + QUESTION_B, 12)
        evaluated = second.engine.context.n_evaluated - before
        cache = second.engine.prompt_cache
        assert cache.hits == 1 and cache.loaded_tokens == len(SYSTEM)
    assert got == expected
    # only the question and the generated tokens were evaluated, not the 300-token prefix
    assert evaluated <= len(QUESTION_B) + 12


def test_the_file_is_read_outside_the_engine_lock(model_path, tmp_path):
    """The submitting thread reads a hit's file before it takes the engine's
    lock, so streams stepping meanwhile do not wait for the disk."""
    with open_llm(model_path, tmp_path) as first:
        first.generate_tokens(SYSTEM + QUESTION_A, 4)
    with open_llm(model_path, tmp_path) as second:
        cache, engine_lock = second.engine.prompt_cache, second.engine._cv
        reads = []
        original = cache.read

        def read(hit):
            reads.append(engine_lock._is_owned())   # by this thread: the one that submits and steps
            return original(hit)

        cache.read = read
        second.generate_tokens(SYSTEM + QUESTION_B, 4)
        assert reads == [False] and cache.hits == 1
        reads.clear()
        second.generate_tokens(SYSTEM + QUESTION_B + [5], 4)   # memory holds it: no file is read
        assert reads == [] and cache.hits == 1


def test_nothing_is_loaded_for_a_prompt_sharing_too_little(model_path, tmp_path):
    with open_llm(model_path, tmp_path) as first:
        first.generate_tokens(SYSTEM + QUESTION_A, 4)
    with open_llm(model_path, tmp_path) as second:
        second.generate_tokens(SYSTEM[:50] + QUESTION_B * 8, 4)   # 50 shared < min_tokens
        assert second.engine.prompt_cache.hits == 0


def test_an_entry_extended_by_a_newer_one_is_replaced(model_path, tmp_path):
    with open_llm(model_path, tmp_path) as llm:
        first = llm.generate_tokens(SYSTEM, 5)
        llm.engine.prompt_cache.flush()
        llm.generate_tokens(SYSTEM + first + QUESTION_A, 5)      # the next turn of a chat
    found = entries(tmp_path)
    assert len(found) == 1
    tokens, _ = read_state_file(found[0], _namespace_of(model_path, tmp_path))
    assert tokens.tolist()[:len(SYSTEM) + len(first) + 1] == SYSTEM + first + QUESTION_A[:1]


def _namespace_of(model_path, folder):
    with open_llm(model_path, folder) as llm:
        return llm.engine.prompt_cache.namespace


def test_the_cache_stays_within_its_size_and_evicts_the_least_recently_used(model_path, tmp_path):
    with open_llm(model_path, tmp_path) as llm:
        per_entry = (len(SYSTEM) + 4) * llm.engine.context.cache.bytes_per_cell
    limit = int(2.5 * per_entry)
    prompts = [rng.integers(1, 96, size=300).tolist() for _ in range(3)]
    with open_llm(model_path, tmp_path, prompt_cache_bytes=limit) as llm:
        cache = llm.engine.prompt_cache

        def run(prompt):
            session = llm.new_session()      # a fresh sequence: the prefix can only come from disk
            session.generate_tokens(prompt, 4)
            session.close()
            cache.flush()

        def held():
            return [read_state_file(p, cache.namespace)[0].tolist()[:300] for p in entries(tmp_path)]

        run(prompts[0])
        run(prompts[1])
        assert held() and all(p in held() for p in prompts[:2])
        run(prompts[0] + QUESTION_A)         # a hit: the first entry is now the most recently used
        assert cache.hits == 1
        run(prompts[2])
        assert sum(p.stat().st_size for p in entries(tmp_path)) <= limit
        assert prompts[1] not in held() and prompts[0] in held() and prompts[2] in held()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "empty", "other-settings"])
def test_a_bad_file_is_ignored_with_a_warning(model_path, tmp_path, caplog, damage):
    with open_llm(model_path) as plain:
        expected = plain.generate_tokens(SYSTEM + QUESTION_B, 8)
    with open_llm(model_path, tmp_path) as first:
        first.generate_tokens(SYSTEM + QUESTION_A, 4)
    (path,) = entries(tmp_path)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "flipped":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    elif damage == "foreign":
        path.write_bytes(b"PK\x03\x04 not a state file" * 100)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        namespace = dict(_namespace_of(model_path, tmp_path), type_k="q8_0")
        tokens, state = read_state_file(path, _namespace_of(model_path, tmp_path))
        write_state_file(path, namespace, tokens, state)
    caplog.set_level(logging.WARNING, logger="elelem")
    with open_llm(model_path, tmp_path) as second:
        got = second.generate_tokens(SYSTEM + QUESTION_B, 8)
        assert second.engine.prompt_cache.hits == 0
    assert got == expected
    assert any("prompt cache: ignoring" in r.getMessage() for r in caplog.records)


def test_two_writers_of_the_same_entry_leave_one_whole_file(model_path, tmp_path):
    namespace = {"model": "test", "format": 1}
    tokens = np.arange(200, dtype=np.int32)
    states = [np.full(200 * 64, i, dtype=np.uint8) for i in range(2)]
    caches = [PromptCache(tmp_path, namespace) for _ in range(2)]
    path = caches[0]._path_for(tokens)
    errors = []

    def write(i):
        try:
            for _ in range(20):
                write_state_file(path, namespace, tokens, states[i])
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got_tokens, got_state = read_state_file(path, namespace)
    assert got_tokens.tolist() == tokens.tolist()
    assert got_state.tolist() in (states[0].tolist(), states[1].tolist())
    assert [p.name for p in path.parent.iterdir()] == [path.name]      # no temporary left behind


def test_state_file_refuses_what_is_not_whole(tmp_path):
    namespace = {"model": "m"}
    path = tmp_path / "x.kvc"
    write_state_file(path, namespace, np.arange(3, dtype=np.int32), np.zeros(30, np.uint8))
    assert path.read_bytes().startswith(MAGIC)
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(StateError, match="longer"):
        read_state_file(path, namespace)
    write_state_file(path, namespace, np.arange(3, dtype=np.int32), np.zeros(30, np.uint8))
    with pytest.raises(StateError, match="another model"):
        read_state_file(path, {"model": "other"})


# -- save_state / load_state ---------------------------------------------------------------

def test_a_loaded_state_continues_as_the_saved_session_would(model_path):
    with open_llm(model_path) as llm:
        llm.generate_tokens(SYSTEM, 6)
        state = pickle.loads(pickle.dumps(llm.save_state()))
        assert state.n_tokens == llm.n_past and state.nbytes == state.n_tokens * \
            llm.engine.context.cache.bytes_per_cell
        expected = llm.eval(QUESTION_A)
        llm.reset()
        llm.load_state(state)
        assert llm.cached_tokens == list(state.tokens)
        np.testing.assert_array_equal(llm.eval(QUESTION_A), expected)
        other = llm.new_session()                 # another session of the same model
        other.load_state(state)
        np.testing.assert_array_equal(other.eval(QUESTION_A), expected)


def test_a_state_from_other_settings_is_refused_and_the_cache_kept(model_path, tiny_model):
    with open_llm(model_path) as llm, open_llm(model_path, kv_type="f32") as f32, \
            open_llm(tiny_model(TinyConfig(seed=3))[0]) as other_model:
        llm.generate_tokens(SYSTEM[:40], 2)
        state = llm.save_state()
        f32.generate_tokens(SYSTEM[:10], 1)
        held = f32.cached_tokens
        with pytest.raises(StateError, match="type_k"):
            f32.load_state(state)
        assert f32.cached_tokens == held
        with pytest.raises(StateError, match="model"):
            other_model.load_state(state)
        with pytest.raises(StateError, match="LLMState"):
            llm.load_state({"tokens": [1, 2]})
