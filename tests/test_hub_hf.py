"""Models from Hugging Face (``hf://ORG/REPO[:QUANT]``), end to end against a stand-in Hub on
loopback (tests/support/hub_standin.py): no network, and a temporary Hugging Face cache -- the user's
is never read or written.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_CACHE when it is imported, so the
in-process tests set its constants; the subprocess tests (Ctrl-C, a pull resumed by the next
process) set the environment variables themselves, as a user would.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

import elelem  # noqa: E402
from elelem.cli import main  # noqa: E402
from elelem.cli.progress import pull_with_progress  # noqa: E402
from elelem.errors import InvalidArgumentError, ModelDownloadError, ModelNotFoundError  # noqa: E402
from elelem.model import hf  # noqa: E402
from gguf_split import split_gguf  # noqa: E402
from hub_standin import TOKEN, Repo, StandInHub  # noqa: E402
from structured_models import CONFIG, CONTROL, MERGES, TOKENS  # noqa: E402
from synthetic import write_model  # noqa: E402

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40
PROMPT = '{"'


def vocabulary(writer):
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3 if t in CONTROL else 1 for t in TOKENS])
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_eos_token_id(TOKENS.index("<|im_end|>"))
    writer.add_add_bos_token(False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two small models with a vocabulary (they write text), and the first split in 2 and in 3."""
    folder = tmp_path_factory.mktemp("hf-models")
    write_model(folder / "a.gguf", CONFIG, extra_metadata=vocabulary)
    write_model(folder / "b.gguf", replace(CONFIG, seed=17, wtype="q8_0"), extra_metadata=vocabulary)
    out = {"a": (folder / "a.gguf").read_bytes(), "b": (folder / "b.gguf").read_bytes()}
    for n in (2, 3):
        (folder / f"s{n}").mkdir()
        out[f"split{n}"] = {p.name: p.read_bytes()
                            for p in split_gguf(folder / "a.gguf", folder / f"s{n}", n, prefix="Tiny-Q4_K_M")}
    with elelem.LLM(folder / "a.gguf", n_ctx=64, n_threads=1) as llm:
        out["text"] = llm.generate(PROMPT, max_tokens=6, temperature=0)
    return out


@pytest.fixture
def standin():
    hub = StandInHub()
    yield hub
    hub.stop()


@pytest.fixture
def cache(tmp_path, monkeypatch, standin):
    """huggingface_hub pointed at the stand-in and at a temporary HF_HOME: every path it derived
    from the real HF_HOME at import (cache, token, its agent registry) is moved under tmp_path."""
    import huggingface_hub.constants as constants
    home = tmp_path / "hf-home"
    real_home = constants.HF_HOME
    for name, value in list(vars(constants).items()):
        if name.isupper() and isinstance(value, str) and value.startswith(real_home):
            monkeypatch.setattr(constants, name, str(home) + value[len(real_home):])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", standin.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        standin.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert hf.cache_root() == home / "hub"
    return home / "hub"


@pytest.fixture(autouse=True)
def restore_elelem_logger():
    logger = logging.getLogger("elelem")
    saved = logger.level, list(logger.handlers)
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]


def tiny_repo(models, repo_id="org/tiny", **options) -> Repo:
    return Repo(repo_id, {"Tiny-Q4_K_M.gguf": models["a"], "Tiny-Q8_0.gguf": models["b"],
                          "mmproj-Tiny-Q4_K_M.gguf": b"not a model", "README.md": b"# tiny\n"},
                commit=options.pop("commit", COMMIT_A), **options)


def storage(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def final_names(cache: Path, repo_id: str) -> list[Path]:
    """Everything under a final name: blobs (not partial downloads) and snapshot links."""
    folder = storage(cache, repo_id)
    blobs = [p for p in (folder / "blobs").glob("*") if not p.name.endswith(".incomplete")]
    return blobs + [p for p in (folder / "snapshots").rglob("*") if not p.is_dir()]


# -- references and the choice of file (no Hub) ------------------------------------


def test_references():
    assert hf.parse_reference("hf://org/repo") == hf.HubRef("org/repo")
    assert hf.parse_reference("hf://org/repo@v1.0:q8_0") == hf.HubRef("org/repo", "v1.0", "q8_0")
    assert hf.parse_reference("hf.co/org/repo:Q4_K_M") == hf.HubRef("org/repo", None, "Q4_K_M")
    assert hf.parse_reference("hf.co/org/repo:latest") == hf.HubRef("org/repo")
    assert hf.parse_reference("hf://org/repo/sub/m-Q8_0.gguf") == hf.HubRef("org/repo", filename="sub/m-Q8_0.gguf")
    assert hf.parse_reference(f"hf://org/repo@{COMMIT_A}/m.gguf").revision == COMMIT_A
    assert str(hf.parse_reference("hf://org/repo@dev:Q8_0")) == "hf://org/repo@dev:Q8_0"
    for bad in ("hf://org", "hf://org/repo:", "hf://org/re po", "hf://org/repo/readme.md", "hf://org/../x",
                "hf://-org/repo", "hf://org/repo/../m.gguf"):
        with pytest.raises(InvalidArgumentError):
            hf.parse_reference(bad)
    assert hf.is_reference("hf://a/b") and hf.is_reference("hf.co/a/b") and not hf.is_reference("model.gguf")


REPO_FILES = ["README.md", "model-IQ4_XS.gguf", "model-Q5_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-f16.gguf",
              "model.imatrix.gguf", "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
              "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf", "model-Q4_K_M-draft.gguf"]


def choose(files, text):
    return hf.choose_files(files, hf.parse_reference(text))


def test_the_quant_is_chosen_as_llama_cpp_chooses_it():
    # no tag: Q4_K_M (here a split model: both files), then Q8_0, then the first model
    assert choose(REPO_FILES, "hf://o/r") == ["Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
                                             "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf"]
    no_q4 = [f for f in REPO_FILES if "Q4_K_M" not in f]
    assert choose(no_q4, "hf://o/r") == ["model-Q8_0.gguf"]
    assert choose([f for f in no_q4 if "Q8_0" not in f], "hf://o/r") == ["model-IQ4_XS.gguf"]
    # a tag, in any case; never mmproj, imatrix or draft files
    assert choose(REPO_FILES, "hf://o/r:q5_k_m") == ["model-Q5_K_M.gguf"]
    assert choose(["mmproj-Q8_0.gguf", "m-Q8_0.gguf"], "hf://o/r:Q8_0") == ["m-Q8_0.gguf"]
    assert choose(["m-Q8_0.gguf", "m-IQ8_0.gguf"], "hf://o/r:Q8_0") == ["m-Q8_0.gguf"]  # the exact tag wins
    assert choose(REPO_FILES, "hf://o/r/model-Q8_0.gguf") == ["model-Q8_0.gguf"]
    # a split model's second file names the whole model
    assert len(choose(REPO_FILES, "hf://o/r/Q4_K_M/model-Q4_K_M-00002-of-00002.gguf")) == 2
    with pytest.raises(ModelNotFoundError, match="no GGUF matches the quant 'Q2_K'; the repository has: "
                                                 "IQ4_XS, Q4_K_M, Q5_K_M, Q8_0"):
        choose(REPO_FILES, "hf://o/r:Q2_K")
    with pytest.raises(ModelNotFoundError, match="the quant 'K_M' matches 2 models .* the repository has"):
        choose(REPO_FILES, "hf://o/r:K_M")
    with pytest.raises(ModelNotFoundError, match="needs 2 files; found 1"):
        choose(REPO_FILES[:-2], "hf://o/r:Q4_K_M")
    with pytest.raises(ModelNotFoundError, match="no GGUF model"):
        choose(["README.md", "mmproj-f16.gguf"], "hf://o/r")


# -- pulling from the stand-in -----------------------------------------------------------


def test_a_pull_chooses_the_quant_downloads_once_and_loads(models, standin, cache):
    standin.add(tiny_repo(models))
    seen = []
    with elelem.LLM("hf://org/tiny", n_ctx=64, n_threads=1, progress=lambda *a: seen.append(a)) as llm:
        assert llm.path.name == "Tiny-Q4_K_M.gguf"
        assert llm.path == storage(cache, "org/tiny") / "snapshots" / COMMIT_A / "Tiny-Q4_K_M.gguf"
        assert llm.generate(PROMPT, max_tokens=6, temperature=0) == models["text"]
    assert seen[0] == ("download", 0, len(models["a"])) and seen[-1][1:] == (len(models["a"]),) * 2
    assert [r["path"].rsplit("-", 1)[-1] for r in standin.cdn_gets()] == [hashlib.sha256(models["a"]).hexdigest()]
    assert all(r["authorization"] is None for r in standin.requests)  # no token anywhere, none sent
    q8 = hf.pull_model("hf://org/tiny:q8_0")
    assert q8.name == "Tiny-Q8_0.gguf" and q8.read_bytes() == models["b"]
    assert (storage(cache, "org/tiny") / "refs" / "main").read_text() == COMMIT_A
    assert sorted(m.ref for m in hf.list_cached()) == ["hf://org/tiny:Q4_K_M", "hf://org/tiny:Q8_0"]


def test_a_missing_or_ambiguous_quant_lists_what_the_repository_has(models, standin, cache, capsys):
    standin.add(tiny_repo(models))
    assert main(["pull", "hf://org/tiny:Q2_K"]) == 1
    err = capsys.readouterr().err
    assert "no GGUF matches the quant 'Q2_K'; the repository has: Q4_K_M, Q8_0" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    standin.add(Repo("org/two", {"a-Q4_K_M.gguf": b"x", "b-Q4_K_M.gguf": b"y"}))
    with pytest.raises(ModelNotFoundError, match="matches 2 models .*a-Q4_K_M.gguf, b-Q4_K_M.gguf"):
        hf.pull_model("hf://org/two:Q4_K_M")
    assert not standin.cdn_gets()


@pytest.mark.parametrize("n_files", [2, 3])
def test_a_split_model_comes_whole_and_generates(models, standin, cache, n_files):
    shards = models[f"split{n_files}"]
    standin.add(Repo("org/split", {**shards, "README.md": b"split\n"}))
    seen = []
    path = hf.pull_model("hf://org/split", progress=lambda *a: seen.append(a))
    assert path.name == f"Tiny-Q4_K_M-00001-of-{n_files:05d}.gguf"
    total = sum(len(b) for b in shards.values())
    assert {t for _, _, t in seen} == {total} and [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)
    assert len(standin.cdn_gets()) == n_files
    with elelem.LLM("hf://org/split", n_ctx=64, n_threads=1) as llm:
        assert len(llm.gguf.shard_paths) == n_files
        assert llm.generate(PROMPT, max_tokens=6, temperature=0) == models["text"]


def test_a_dropped_connection_resumes_where_it_stopped(standin, cache):
    import huggingface_hub.constants as constants
    # huggingface_hub writes what it receives every DOWNLOAD_CHUNK_SIZE (10 MB): what it had
    # written when the connection dropped is kept, and the next pull asks for the rest.
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    data = os.urandom(2 * chunk + 12345)
    standin.add(Repo("org/big", {"big-Q8_0.gguf": data}))
    standin.drop_after, standin.status_after_drop = chunk + chunk // 2, 503  # drop, then refuse the retry
    with pytest.raises(ModelDownloadError, match="pull again to resume"):
        hf.pull_model("hf://org/big")
    partial = storage(cache, "org/big") / "blobs" / (hashlib.sha256(data).hexdigest() + ".incomplete")
    assert partial.stat().st_size == chunk
    assert final_names(cache, "org/big") == []
    assert standin.cdn_gets()[-1]["range"] == f"bytes={chunk}-"  # huggingface_hub's own retry, refused
    standin.cdn_status = None
    standin.clear_log()
    seen = []
    path = hf.pull_model("hf://org/big", progress=lambda *a: seen.append(a))
    assert [r["range"] for r in standin.cdn_gets()] == [f"bytes={chunk}-"]
    assert seen[0] == ("download", chunk, len(data)) and seen[-1] == ("download", len(data), len(data))
    assert path.read_bytes() == data and not partial.exists()


def test_a_partial_file_is_resumed_or_replaced(models, standin, cache):
    """A partial download left by another process is resumed; a server that ignores the Range
    sends the whole file, which replaces it; a partial that is not the file's start fails the
    hash and is deleted."""
    standin.add(tiny_repo(models))
    data = models["a"]
    blobs = storage(cache, "org/tiny") / "blobs"
    partial = blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")
    blobs.mkdir(parents=True)
    partial.write_bytes(data[:1000])
    assert hf.pull_model("hf://org/tiny").read_bytes() == data
    assert [r["range"] for r in standin.cdn_gets()] == ["bytes=1000-"]
    hf.remove("hf://org/tiny")
    blobs.mkdir(parents=True)
    partial.write_bytes(data[:1000])
    standin.ignore_range = True
    seen = []
    assert hf.pull_model("hf://org/tiny", progress=lambda *a: seen.append(a)).read_bytes() == data
    assert seen[-1] == ("download", len(data), len(data))
    hf.remove("hf://org/tiny")
    blobs.mkdir(parents=True)
    partial.write_bytes(b"x" * 1000)  # not this file's first bytes
    standin.ignore_range = False
    with pytest.raises(ModelDownloadError, match="sha256 is"):
        hf.pull_model("hf://org/tiny")
    assert not partial.exists() and final_names(cache, "org/tiny") == []
    assert hf.pull_model("hf://org/tiny").read_bytes() == data


def test_an_unchanged_etag_downloads_nothing(models, standin, cache):
    standin.add(tiny_repo(models))
    first = hf.pull_model("hf://org/tiny")
    standin.clear_log()
    assert hf.pull_model("hf://org/tiny") == first
    assert [r["path"] for r in standin.requests] == ["/api/models/org/tiny"]  # one API call, no transfer
    # A new commit, the same file (the same ETag): linked, not downloaded.
    standin.add(tiny_repo(models, commit=COMMIT_B))
    standin.clear_log()
    second = hf.pull_model("hf://org/tiny")
    assert second.parent.name == COMMIT_B and second.resolve() == first.resolve()
    assert standin.cdn_gets() == []
    # A new commit that changes the file: downloaded.
    standin.add(Repo("org/tiny", {"Tiny-Q4_K_M.gguf": models["b"]}, commit=COMMIT_C))
    third = hf.pull_model("hf://org/tiny")
    assert third.read_bytes() == models["b"] and len(standin.cdn_gets()) == 1


def test_offline_the_cache_answers(models, standin, cache, monkeypatch, caplog):
    import huggingface_hub.constants as constants
    standin.add(tiny_repo(models))
    path = hf.pull_model("hf://org/tiny")
    standin.stop()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1
    with elelem.LLM("hf://org/tiny", n_ctx=64, n_threads=1) as llm:
        assert llm.path == path and llm.generate(PROMPT, max_tokens=6, temperature=0) == models["text"]
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache .* HF_HUB_OFFLINE"):
        hf.pull_model("hf://org/other")
    with pytest.raises(ModelNotFoundError, match="the repository has: Q4_K_M"):  # the cached quants
        hf.pull_model("hf://org/tiny:Q8_0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # no flag, but the Hub is gone
    with caplog.at_level(logging.WARNING, logger="elelem"):
        assert hf.pull_model("hf://org/tiny") == path
    assert "cannot reach" in caplog.text and "using the cached copy" in caplog.text
    with pytest.raises(ModelDownloadError, match="cannot reach .* not in the Hugging Face cache"):
        hf.pull_model("hf://org/other")


def test_a_checksum_mismatch_is_refused_and_nothing_is_cached(models, standin, cache):
    repo = standin.add(tiny_repo(models))
    bad = bytearray(models["a"])
    bad[len(bad) // 2] ^= 0xFF
    repo.served["Tiny-Q4_K_M.gguf"] = bytes(bad)  # same size: only the hash can tell
    with pytest.raises(ModelDownloadError, match="sha256 is [0-9a-f]{64}, but the Hub lists "
                                                 f"{hashlib.sha256(models['a']).hexdigest()}"):
        hf.pull_model("hf://org/tiny")
    assert final_names(cache, "org/tiny") == []
    assert list((storage(cache, "org/tiny") / "blobs").glob("*.incomplete")) == []
    assert hf.cached("hf://org/tiny") is None
    del repo.served["Tiny-Q4_K_M.gguf"]
    assert hf.pull_model("hf://org/tiny").read_bytes() == models["a"]


def test_private_and_gated_repositories_need_a_token(models, standin, cache, monkeypatch):
    standin.add(tiny_repo(models, repo_id="org/private", private=True))
    standin.add(tiny_repo(models, repo_id="org/gated", gated=True))
    with pytest.raises(ModelNotFoundError, match="no repository org/private .* private or gated, log in "
                                                 r"\('hf auth login'\) or set HF_TOKEN"):
        hf.pull_model("hf://org/private")
    with pytest.raises(ModelDownloadError, match="the repository is gated: accept its conditions at "
                                                 f"{standin.endpoint}/org/gated"):
        hf.pull_model("hf://org/gated")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    standin.clear_log()
    assert hf.pull_model("hf://org/private").read_bytes() == models["a"]
    assert hf.pull_model("hf://org/gated").read_bytes() == models["a"]
    hub_calls = [r for r in standin.requests if r["origin"] == "hub" and r["path"].startswith(("/api/models", "/org"))]
    assert hub_calls and all(r["authorization"] == f"Bearer {TOKEN}" for r in hub_calls)
    assert standin.cdn_gets() and all(r["authorization"] is None for r in standin.cdn_gets())  # it stays on the Hub
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ModelNotFoundError, match="that this token can read"):
        hf.pull_model("hf://org/private", force=True)


def test_an_unknown_repository_is_one_clear_line(models, standin, cache, capsys):
    standin.add(tiny_repo(models))
    assert main(["run", "-m", "hf://org/nope", "hi"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("elelem: error: hf://org/nope: no repository org/nope on http://127.0.0.1:")
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert main(["pull", "hf://org/tiny@nope"]) == 1
    assert "has no revision 'nope'" in capsys.readouterr().err


def test_huggingface_hub_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ModelDownloadError, match=r"pip install 'elelem\[hub\]'"):
        hf.pull_model("hf://org/tiny")


# -- the command line and the compat layer ------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_cli_pulls_with_one_bar_lists_and_removes(models, standin, cache, capsys):
    standin.add(Repo("org/split", models["split3"]))
    stream = Terminal()
    path = pull_with_progress("hf://org/split", stream=stream)
    lines = [line.split("\x1b[K")[0] for line in stream.getvalue().replace("\r", "\n").split("\n") if line]
    assert lines[0] == "hf://org/split: looking up the files on Hugging Face"
    assert any(line.startswith("hf://org/split: downloaded ") for line in lines)
    assert lines[-1] == f"hf://org/split: ready at {path} (sha256 checked)"
    assert main(["pull", "hf://org/split"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(path) and "(up to date)" in err
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "hf://org/split:Q4_K_M" in out and "3 files" in out and "smollm2-135m" in out
    assert main(["info", "hf://org/split"]) == 0
    assert "in 3 files (a split model)" in capsys.readouterr().out
    assert main(["rm", "hf://org/split:Q4_K_M"]) == 0
    assert not storage(cache, "org/split").exists() and hf.list_cached() == []
    assert main(["rm", "hf://org/split"]) == 1
    assert "not in the Hugging Face cache" in capsys.readouterr().err


def test_run_names_a_model_on_the_hub(models, standin, cache, capsys):
    standin.add(tiny_repo(models))
    assert main(["run", "-m", "hf.co/org/tiny:Q4_K_M", "--raw", "-n", "6", "--temperature", "0", PROMPT]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == models["text"].strip()
    assert "downloaded" in err
    assert main(["run", "-m", "hf://org/tiny", "--raw", "-n", "6", "--temperature", "0", PROMPT]) == 0
    assert capsys.readouterr().err == ""  # already in the cache: nothing to say


def test_removing_one_quant_keeps_the_others(models, standin, cache):
    standin.add(tiny_repo(models))
    q4, q8 = hf.pull_model("hf://org/tiny"), hf.pull_model("hf://org/tiny:Q8_0")
    blob = q4.resolve()
    assert hf.remove("hf://org/tiny:Q4_K_M") == [q4]
    assert not q4.exists() and not blob.exists() and q8.is_file()
    assert [m.ref for m in hf.list_cached()] == ["hf://org/tiny:Q8_0"]


def test_llama_from_pretrained(models, standin, cache, tmp_path):
    from elelem.compat import Llama
    standin.add(tiny_repo(models))
    with Llama.from_pretrained("org/tiny", "*Q8_0.gguf", n_ctx=64, verbose=False) as llm:
        assert Path(llm.model_path).name == "Tiny-Q8_0.gguf"
    local = tmp_path / "local"
    with Llama.from_pretrained("org/tiny", "Tiny-Q4_K_M.gguf", additional_files=["README.md"],
                               local_dir=local, n_ctx=64, verbose=False) as llm:
        assert llm.model_path == str(local / "Tiny-Q4_K_M.gguf") and (local / "README.md").is_file()
    with pytest.raises(ModelNotFoundError, match="matches 2 models"):
        Llama.from_pretrained("org/tiny", "Tiny-*.gguf")
    with Llama("hf://org/tiny:Q8_0", n_ctx=64, verbose=False) as llm:  # a reference is a model_path too
        assert llm.llm.path.name == "Tiny-Q8_0.gguf"


# -- Ctrl-C, and the next process resumes ---------------------------------------------


def test_ctrl_c_leaves_no_final_file_and_the_next_process_resumes(standin, cache, tmp_path):
    # huggingface_hub writes what it receives every 10 MB (DOWNLOAD_CHUNK_SIZE): a bigger file.
    data = os.urandom(24 << 20)
    standin.add(Repo("org/big", {"big-Q4_K_M.gguf": data}))
    standin.throttle = 0.01  # about 4 s for the whole file
    env = {**os.environ, "HF_ENDPOINT": standin.endpoint, "HF_HOME": str(cache.parent), "HF_HUB_CACHE": str(cache),
           "NO_PROXY": "127.0.0.1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(name, None)
    command = [sys.executable, "-m", "elelem", "pull", "hf://org/big"]
    partial = storage(cache, "org/big") / "blobs" / (hashlib.sha256(data).hexdigest() + ".incomplete")
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (partial.exists() and partial.stat().st_size >= 10 << 20):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err
    kept = partial.stat().st_size
    assert 0 < kept < len(data)
    assert final_names(cache, "org/big") == []  # nothing under a final name
    standin.throttle = 0
    standin.clear_log()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [r["range"] for r in standin.cdn_gets()] == [f"bytes={kept}-"]
    assert Path(result.stdout.strip()).read_bytes() == data and not partial.exists()
