"""A model's load beside running models: its tokenizer tables are built in short holds of the
GIL and give the same strings and ids, tokenizer metadata checked once is not
checked again, models of one tokenizer share it, and the cyclic GC does not walk its tables.

The pool loads a model in the process that is answering for the others (``server/quiet_load.py``);
these are the pieces of that load that ran in Python holding the GIL.
"""
from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from elelem.errors import GGUFMetadataError
from elelem.gguf import tokenizer_metadata
from elelem.gguf.file import _decode_joined
from elelem.gguf.reader import read_gguf, validate_tokenizer_metadata
from elelem.gguf.short_holds import SLICE, dict_in_slices, set_in_slices
from elelem.text.tokenizer import Tokenizer
from gguf_builders import ARRAY, INT32, STRING, UINT32, RawGGUF

# Strings across several slices: multi-byte characters, empty strings, a newline, a lone
# character of each UTF-8 length, and one string per slice boundary.
STRINGS = [f"t{i}" if i % 7 else ["", "é", "€", "😀", "a\nb", "Ġhello", "▁x"][i % 49 // 7]
           for i in range(2 * SLICE + 11)]


def string_array(tmp_path, strings, name="a.gguf"):
    path = tmp_path / name
    RawGGUF().kv("a", ARRAY, (STRING, strings)).write(path)
    return read_gguf(path).metadata["a"]


@pytest.mark.parametrize("count", [0, 1, SLICE - 1, SLICE, SLICE + 1, len(STRINGS)])
def test_string_arrays_decode_in_slices_as_string_by_string(tmp_path, count):
    lazy = string_array(tmp_path, STRINGS[:count])
    joined = _decode_joined(lazy._blob, lazy._ends)
    assert joined == lazy._decode_one_by_one() == STRINGS[:count]
    assert list(lazy) == STRINGS[:count]


def test_a_string_with_a_nul_is_decoded_string_by_string(tmp_path):
    strings = STRINGS[:SLICE + 5] + ["a\0b"] + STRINGS[:3]
    lazy = string_array(tmp_path, strings)
    assert _decode_joined(lazy._blob, lazy._ends) is None  # the joined decode would split it
    assert list(lazy) == strings


def test_bad_utf8_in_a_later_slice_is_named_as_before(tmp_path):
    strings: list = list(STRINGS[:SLICE + 20])
    strings[SLICE + 3] = b"ok\xc0\xaf"
    lazy = string_array(tmp_path, strings)
    assert _decode_joined(lazy._blob, lazy._ends) is None
    with pytest.raises(GGUFMetadataError, match="UTF-8") as caught:
        lazy[0]
    assert caught.value.field == f"key 'a'[{SLICE + 3}]"


def test_dicts_and_sets_in_slices_are_dict_and_set():
    keys = [f"k{i % (SLICE + 100)}" for i in range(3 * SLICE)]  # duplicates across slices: the later wins
    assert dict_in_slices(zip(keys, range(len(keys)))) == dict(zip(keys, range(len(keys))))
    assert list(dict_in_slices(zip(keys, range(len(keys))))) == list(dict(zip(keys, range(len(keys)))))
    assert dict_in_slices([]) == {}
    assert set_in_slices(keys) == set(keys) and set_in_slices([]) == set()


# -- big tables the cyclic GC does not walk ---------------------------------------------------------

def test_a_real_tokenizers_big_tables_are_not_walked_by_the_cyclic_gc(qwen_path):
    """The tables a tokenizer keeps as long as its model (the vocabulary, its attributes, the
    decoding pieces, the file's string arrays) are tuples: the cyclic GC untracks a tuple of
    strings or numbers at its first collection, and visited a list's items at every full
    collection afterwards (25 ms a collection for Qwen2's)."""
    meta = read_gguf(qwen_path).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    tokenizer.build_tables()
    gc.collect()
    vocab = tokenizer._vocab
    tables = {"tokens": vocab.tokens, "attrs": vocab.attrs, "plain pieces": tokenizer._pieces[0],
              "special pieces": tokenizer._pieces[1], "the file's tokens": meta["tokenizer.ggml.tokens"]._items,
              "token ids": vocab.token_to_id, "merge ranks": tokenizer._model.ranks}
    assert {name: len(table) for name, table in tables.items() if len(table) < 100_000} == {}
    assert [name for name, table in tables.items() if gc.is_tracked(table)] == []


# -- one tokenizer for the models that have the same ------------------------------------------------

def test_models_with_the_same_tokenizer_metadata_share_one_tokenizer(smollm_path, qwen_path):
    import elelem
    from elelem.api import assets
    first = elelem.LLM(smollm_path, n_ctx=64, n_threads=1)
    second = elelem.LLM(smollm_path, n_ctx=64, n_threads=1)
    other = elelem.LLM(qwen_path, n_ctx=64, n_threads=1)
    try:
        assert first.tokenizer is second.tokenizer and other.tokenizer is not first.tokenizer
        assert first.assets.tokenizer_lock is second.assets.tokenizer_lock
        shared = weakref.ref(first.tokenizer)
        assert first.create_completion("Hi", max_tokens=3, temperature=0)["choices"][0]["text"] == \
            second.create_completion("Hi", max_tokens=3, temperature=0)["choices"][0]["text"]
    finally:
        for llm in (first, second, other):
            llm.close()
    del first, second
    assert shared() is None and len(assets._tokenizers) <= 1   # no model holds it: gone


@pytest.mark.parametrize("which", ["qwen_path", "gemma_path"])
def test_the_tables_built_at_load_are_the_ones_first_use_builds(request, which):
    """build_tables (a server's load) builds the decoding pieces and the merge or score ranks that
    a first encode and decode would: the ids and text are the same, and nothing is left to build."""
    meta = read_gguf(request.getfixturevalue(which)).metadata
    built, lazy = Tokenizer.from_metadata(meta), Tokenizer.from_metadata(meta)
    built.build_tables()
    model = built._model
    assert built._pieces is not None
    assert getattr(model, "_ranks", None) is not None or getattr(model, "_score_rank_table", None) is not None
    for text in TEXTS:
        ids = built.encode(text, special=True)
        assert ids == lazy.encode(text, special=True) and built.decode(ids) == lazy.decode(ids)


# -- tokenizer metadata checked once ---------------------------------------------------------------

TOKENS = ["a", "b", "c", "ab", "abc", "Ġ", "Ġa", "<|endoftext|>"]
MERGES = ["a b", "ab c", "Ġ a"]


def tokenizer_file(tmp_path, name: str, merges=MERGES, token_type_kind=INT32):
    path = tmp_path / name
    (RawGGUF().kv("general.architecture", STRING, "qwen2").kv("tokenizer.ggml.model", STRING, "gpt2")
     .kv("tokenizer.ggml.tokens", ARRAY, (STRING, TOKENS))
     .kv("tokenizer.ggml.token_type", ARRAY, (token_type_kind, [1] * 7 + [3]))
     .kv("tokenizer.ggml.merges", ARRAY, (STRING, merges))
     .kv("tokenizer.ggml.eos_token_id", UINT32, 7).write(path))
    return read_gguf(path)


@pytest.fixture
def checks(monkeypatch):
    """How many times the checks themselves ran; nothing passed before this test."""
    monkeypatch.setattr(tokenizer_metadata, "_passed", type(tokenizer_metadata._passed)())
    ran = []
    real = tokenizer_metadata._validate
    monkeypatch.setattr(tokenizer_metadata, "_validate", lambda gguf: (ran.append(gguf.path), real(gguf)))
    return ran


def test_tokenizer_metadata_that_passed_passes_again_without_the_checks(tmp_path, checks):
    validate_tokenizer_metadata(tokenizer_file(tmp_path, "one.gguf"))
    validate_tokenizer_metadata(tokenizer_file(tmp_path, "one.gguf"))  # the model loaded again
    validate_tokenizer_metadata(tokenizer_file(tmp_path, "copy.gguf"))  # the same tokenizer elsewhere
    assert len(checks) == 1


def test_a_changed_tokenizer_is_checked_again(tmp_path, checks):
    validate_tokenizer_metadata(tokenizer_file(tmp_path, "one.gguf"))
    # The same file rewritten with one merge changed (same length): the checks run, and fail.
    with pytest.raises(GGUFMetadataError, match=r"merges'\[1\].*'bc'"):
        validate_tokenizer_metadata(tokenizer_file(tmp_path, "one.gguf", merges=["a b", "b c", "Ġ a"]))
    with pytest.raises(GGUFMetadataError, match=r"merges'\[1\]"):  # a failure is never remembered
        validate_tokenizer_metadata(tokenizer_file(tmp_path, "one.gguf", merges=["a b", "b c", "Ġ a"]))
    # The same bytes under another GGUF type: another digest, checked (and refused) again.
    with pytest.raises(GGUFMetadataError, match="token_type"):
        validate_tokenizer_metadata(tokenizer_file(tmp_path, "one.gguf", token_type_kind=UINT32))
    assert len(checks) == 4


def test_the_digest_covers_decoded_arrays_and_every_tokenizer_key(tmp_path):
    first = tokenizer_file(tmp_path, "one.gguf")
    again = tokenizer_file(tmp_path, "two.gguf")
    digest = tokenizer_metadata.tokenizer_digest(first)
    assert tokenizer_metadata.tokenizer_digest(again) == digest
    list(again.metadata["tokenizer.ggml.tokens"])  # decoded: hashed from the strings, the same content
    decoded = tokenizer_metadata.tokenizer_digest(again)
    list(first.metadata["tokenizer.ggml.tokens"])
    assert tokenizer_metadata.tokenizer_digest(first) == decoded
    first.metadata["tokenizer.ggml.eos_token_id"] = 6
    assert tokenizer_metadata.tokenizer_digest(first) != decoded
    first.metadata["general.name"] = "not a tokenizer key"
    first.metadata["tokenizer.ggml.eos_token_id"] = 7
    assert tokenizer_metadata.tokenizer_digest(first) == decoded


# -- the same ids from a real vocabulary -----------------------------------------------------------

TEXTS = ["Hello, world!", "def reverse(s):\n    return s[::-1]\n", "héllo wörld 😀 — ünïcödé",
         "  spaces\t\ttabs\n\n<|im_start|>user<|im_end|>"]


@pytest.mark.parametrize("which", ["qwen_path", "smollm_path"])
def test_a_real_vocabulary_reads_and_tokenizes_as_string_by_string(request, which, monkeypatch):
    path = request.getfixturevalue(which)
    fast = read_gguf(path)
    slow = read_gguf(path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        lazy = slow.metadata[key]
        assert list(fast.metadata[key]) == lazy._decode_one_by_one()
    # The tokenizer over the string-by-string decode, with the tables built by dict(): the same ids.
    monkeypatch.setattr("elelem.gguf.file._decode_joined", lambda blob, ends: None)
    monkeypatch.setattr("elelem.text.tokenizer.vocab.dict_in_slices", dict)
    monkeypatch.setattr("elelem.text.tokenizer.bpe.dict_in_slices", dict)
    reference = Tokenizer.from_metadata(slow.metadata)
    monkeypatch.undo()
    validate_tokenizer_metadata(fast)
    tokenizer = Tokenizer.from_metadata(fast.metadata)
    assert tokenizer.eog_ids == reference.eog_ids and tokenizer.n_vocab == reference.n_vocab
    assert tokenizer._split_special._ids == reference._split_special._ids
    for text in TEXTS:
        ids = tokenizer.encode(text, special=True)
        assert ids == reference.encode(text, special=True)
        assert tokenizer.decode(ids) == reference.decode(ids)
    assert np.array_equal(np.array(tokenizer._vocab.attrs), np.array(reference._vocab.attrs))


# -- closing a model beside running threads ------------------------------------------------------

def _schedstat(tid: int) -> tuple[float, float]:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        cpu, wait, _ = f.read().split()
    return int(cpu) / 1e9, int(wait) / 1e9


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread scheduler accounting is Linux's")
def test_closing_a_model_lets_other_threads_run_python_meanwhile(qwen_path):
    """Unmapping a model and freeing its repacked weights is done without the GIL: a thread
    running Python beside the close gets on with it.  (The pool unloads a model in a thread at
    the lowest priority, where a hold of the GIL stretched to a second on a busy machine.)

    The measure is the spinning thread's progress per CPU second it got, during the close
    against before it: waiting for the GIL it still wakes every switch interval, on the CPU
    and counting nothing, so its progress per CPU second drops to near 0."""
    import elelem
    spins, done, ready = [0], threading.Event(), threading.Event()
    native: list[int] = []

    def spin() -> None:
        native.append(threading.get_native_id())
        ready.set()
        while not done.is_set():
            spins[0] += 1

    def progress(tid: int, work) -> tuple[int, float]:
        n0, (c0, _) = spins[0], _schedstat(tid)
        work()
        n1, (c1, _) = spins[0], _schedstat(tid)
        return n1 - n0, c1 - c0

    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        for _ in range(3):  # until the spinning thread got 2 ms of CPU during the close
            llm = elelem.LLM(qwen_path, n_ctx=256, n_threads=1, use_mmap=False)  # the weights in memory, to free
            done.clear()
            ready.clear()
            worker = threading.Thread(target=spin)
            worker.start()
            ready.wait()
            try:
                base_spins, base_cpu = progress(native[-1], lambda: time.sleep(0.05))
                close_spins, close_cpu = progress(native[-1], llm._model.close)
            finally:
                done.set()
                worker.join()
                llm.close()
            if close_cpu > 0.002 and base_cpu > 0.002:
                break
    finally:
        sys.setswitchinterval(previous)
    assert close_cpu > 0.002 and base_cpu > 0.002, "the close was too quick to tell"
    rate = (close_spins / close_cpu) / (base_spins / base_cpu)
    assert rate > 0.5, f"beside the close, {rate:.2f} of the Python work per CPU second ({close_cpu * 1000:.1f} ms)"
