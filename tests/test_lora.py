"""LoRA adapters (elelem.api.lora, _native/adapter.pxi, graph/lora.pxi): logits
against llama.cpp live with the same adapter files, against a NumPy reference
(the weights merged), scale 0 against the model alone, several adapters and
sequences at different scales in one step against each alone, prefix reuse
kept apart by scales, and bad adapter files refused with a clear error.

The adapters are written as llama.cpp's convert_lora_to_gguf.py writes them
(tests/support/synthetic_lora.py); the models are SmolLM2 (its Q4_1 and Q8_0
weights: elelem's small-batch kernels in batched steps) and a synthetic
qwen3moe with SmolLM2's vocabulary (llama.cpp insists on one), untied, so
that its token embedding and expert stacks carry adapters too.
"""
from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

import elelem
from elelem.cpu import cpu_backend_info
from elelem.errors import AdapterError, InvalidArgumentError
from kernel_choice import small_batch_isa  # noqa: F401 (a fixture)
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, reference_logits, write_model
from synthetic_lora import weight_shapes, write_lora
from vocab_metadata import vocab_writer

TOKENS = [1, 504, 3458, 281, 2114, 30, 10453, 8744, 314, 1345, 28, 339, 4910, 17]
N_PROMPT = 9
MOE = TinyConfig(arch="qwen3moe", head_dim=32, n_vocab=49152, seed=3)
SMOLLM_A = ["blk.0.attn_q.weight", "blk.3.attn_v.weight", "blk.7.ffn_down.weight", "blk.29.ffn_up.weight"]
SMOLLM_B = ["blk.0.attn_k.weight", "blk.12.attn_output.weight", "blk.20.ffn_gate.weight"]   # apart from A's
MOE_TARGETS = ["token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate_inp.weight",
               "blk.0.ffn_up_exps.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight"]


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    """The models and adapters, written once: name -> path."""
    tmp = tmp_path_factory.mktemp("lora")
    moe = tmp / "moe.gguf"
    write_model(moe, MOE, extra_metadata=vocab_writer(smollm_path))
    smollm = weight_shapes(smollm_path)
    moe_shapes = weight_shapes(moe)
    out = {"smollm": smollm_path, "moe": moe}
    write_lora(tmp / "smollm_a.gguf", "llama", {n: smollm[n] for n in SMOLLM_A}, rank=8, alpha=16.0, seed=1)
    write_lora(tmp / "smollm_b.gguf", "llama", {n: smollm[n] for n in SMOLLM_B}, rank=4, alpha=None, seed=2,
               dtype="f16")
    write_lora(tmp / "moe_a.gguf", "qwen3moe", {n: moe_shapes[n] for n in MOE_TARGETS}, rank=8, alpha=32.0,
               seed=3, embedding="token_embd.weight")
    for name in ("smollm_a", "smollm_b", "moe_a"):
        out[name] = tmp / f"{name}.gguf"
    return out


def row_digest(row) -> str:
    return hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).hexdigest()


CASES = [  # name, model, adapters [(file, scale)], flash attention, how llama-cpp-python is given them
    ("smollm_lora_path", "smollm", [("smollm_a", 0.5)], False, "lora_path"),
    ("smollm_two", "smollm", [("smollm_a", 0.5), ("smollm_b", 1.0)], False, "low_level"),
    ("smollm_flash", "smollm", [("smollm_b", -0.75)], True, "low_level"),
    ("moe", "moe", [("moe_a", 0.5)], False, "low_level"),
]


@pytest.fixture(scope="module")
def llamacpp_lora(llamacpp, files):
    cases = [{"name": name, "model": str(files[model]), "adapters": [[str(files[f]), s] for f, s in adapters],
              "tokens": TOKENS, "n_prompt": N_PROMPT, "flash_attn": flash, "api": api}
             for name, model, adapters, flash, api in CASES]
    inputs = [files[k] for k in ("smollm", "moe", "smollm_a", "smollm_b", "moe_a")]
    return llamacpp.lora_logits(cases, inputs)["cases"]


def elelem_rows(path, adapters, flash_attn: bool) -> list[np.ndarray]:
    """The prompt's rows from one step, then one step a token, as make_lora_fixtures.py does."""
    options = {**elelem_kernel_options(), "flash_attn": flash_attn}
    with elelem.LLM(path, lora=adapters, n_ctx=256, kv_type="f16", n_threads=THREADS, **options) as llm:
        rows = list(np.asarray(llm.eval(TOKENS[:N_PROMPT], all_logits=True)))
        rows += [np.asarray(llm.eval([t])) for t in TOKENS[N_PROMPT:]]
    return rows


@pytest.mark.real_model
@pytest.mark.parametrize("name, model, adapters, flash_attn, api", CASES, ids=[c[0] for c in CASES])
def test_logits_are_llamacpps_bit_for_bit(files, llamacpp_lora, name, model, adapters, flash_attn, api):
    want = llamacpp_lora[name]["rows"]
    got = elelem_rows(files[model], [(files[f], s) for f, s in adapters], flash_attn)
    assert len(got) == len(want) == len(TOKENS)
    for i, (row, ref) in enumerate(zip(got, want)):
        if row_digest(row) != ref["sha256"]:
            diff = np.abs(row[:len(ref["head"])] - np.asarray(ref["head"], dtype=np.float32)).max()
            pytest.fail(f"{name}: row {i} differs from llama.cpp's (first values up to {diff:g} apart)")
        assert int(np.argmax(row)) == ref["argmax"]


@pytest.mark.real_model
def test_an_adapter_changes_the_logits_and_scale_0_is_the_model_alone(files):
    base = elelem_rows(files["smollm"], [], False)
    zero = elelem_rows(files["smollm"], [(files["smollm_a"], 0.0)], False)
    half = elelem_rows(files["smollm"], [(files["smollm_a"], 0.5)], False)
    for b, z, h in zip(base, zero, half):
        np.testing.assert_array_equal(z, b)
        assert np.abs(h - b).max() > 1e-2   # the adapter does something
    with elelem.LLM(files["smollm"], lora=[files["smollm_a"]], n_ctx=256, n_threads=THREADS,
                    **elelem_kernel_options()) as llm:
        assert llm.lora_adapters[0]["scale"] == 1.0
        llm.set_lora({0: 0.0})    # at run time
        np.testing.assert_array_equal(np.asarray(llm.eval(TOKENS[:N_PROMPT], all_logits=True)),
                                      np.asarray(base[:N_PROMPT]))


# -- the NumPy reference: an adapter is its weights merged ---------------------------

@pytest.mark.parametrize("cfg, targets, embedding", [
    (TinyConfig(arch="qwen2", seed=4), ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight",
                                        "output.weight", "token_embd.weight"], "token_embd.weight"),
    (TinyConfig(arch="qwen3moe", head_dim=32, seed=5), ["blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight",
                                                        "blk.0.ffn_gate_exps.weight", "blk.1.attn_output.weight"],
     None),
], ids=["dense", "experts"])
def test_logits_follow_the_merged_weights(tiny_model, tmp_path, cfg, targets, embedding):
    path, weights = tiny_model(cfg)
    shapes = weight_shapes(path)
    factors = write_lora(tmp_path / "a.gguf", cfg.arch, {n: shapes[n] for n in targets}, rank=4, alpha=6.0,
                         embedding=embedding, seed=9)
    scale = 0.75 * 6.0 / 4
    merged = dict(weights)
    for name, (a, b) in factors.items():
        merged[name] = weights[name] + scale * (a @ b.T if name == embedding else b @ a)
    tokens = [1, 5, 9, 22, 40, 3, 7, 11, 60]
    with elelem.LLM(path, lora=[(tmp_path / "a.gguf", 0.75)], n_ctx=64, kv_type="f32", flash_attn=False) as llm:
        got = np.asarray(llm.eval(tokens, all_logits=True), dtype=np.float64)
    want = reference_logits(merged, cfg, tokens)
    assert np.abs(want - reference_logits(weights, cfg, tokens)).max() > 0.1   # it moves the logits
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)


# -- batching: each sequence at its own scales gets its solo logits -----------------

@pytest.mark.real_model
@pytest.mark.parametrize("model, adapters", [("smollm", ("smollm_a", "smollm_b")), ("moe", ("moe_a",))])
@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
def test_sequences_at_different_scales_share_a_step_exactly(files, model, adapters, flash_attn):
    scales = [(0.5, 1.0), (0.0, 0.0), (1.0, -0.5)] if len(adapters) == 2 else [(0.5,), (0.0,), (-1.0,)]
    with elelem.LLM(files[model], lora=[files[a] for a in adapters], n_ctx=256, n_seq_max=4, kv_size=512,
                    n_threads=THREADS, flash_attn=flash_attn, amx=False) as llm:
        ctx = llm.engine.context
        for s, sc in enumerate(scales):
            ctx.set_lora_scales(s, sc)
        rng = np.random.default_rng(5)
        prompts = [rng.integers(0, 49152, n).tolist() for n in (11, 5, 17)]
        alone = []
        for prompt in prompts:   # each alone, on sequence 3 at its scales
            ctx.set_lora_scales(3, scales[len(alone)])
            alone.append(ctx.decode(prompt, [3] * len(prompt))[-1])
            ctx.cache.seq_rm(3, 0)
        together = ctx.decode([t for p in prompts for t in p], [s for s, p in enumerate(prompts) for _ in p])
        for s, row in enumerate(together):
            np.testing.assert_array_equal(row, alone[s], err_msg=f"prompt {s}")
        bases = [ctx.cache.seq_length_of(s) for s in range(3)]
        for n in (2, 3, 6, 8, 12, 17):   # generated tokens of any width: one-token numbers (matmul.pxi)
            tokens = rng.integers(0, 49152, n).tolist()
            seqs = [i % 3 for i in range(n)]
            one_each = np.concatenate([ctx.decode([t], [s], True) for t, s in zip(tokens, seqs)])
            for s in range(3):
                ctx.cache.seq_rm(s, bases[s])
            step = ctx.decode(tokens, seqs, True, decode_kernels=True)
            np.testing.assert_array_equal(step, one_each, err_msg=f"{n} generated tokens")
            for s in range(3):
                ctx.cache.seq_rm(s, bases[s])


@pytest.mark.real_model
def test_calls_with_different_adapters_run_together_and_reuse_only_their_own_prefixes(files):
    prompt = "The quick brown fox jumps over the lazy dog because"
    with elelem.LLM(files["smollm"], lora=[(files["smollm_a"], 0.0), (files["smollm_b"], 0.0)], n_ctx=256,
                    n_threads=THREADS, speculative=False) as llm:
        asks = [None, {0: 1.0}, [{"id": 1, "scale": 1.5}], [0.5, 0.5]]
        solo = [llm.generate(prompt, max_tokens=12, temperature=0, lora=a) for a in asks]
        assert len(set(solo)) > 1, solo   # the adapters change the text
        # Each after the others: a prefix is reused only from cells at the same scales.
        for ask, want in zip(asks, solo):
            stream = llm.stream(prompt, max_tokens=12, temperature=0, lora=ask)
            assert stream.text() == want
        # All at once, from threads: batched in the same steps, each its own text.
        got = [None] * len(asks)

        def run(i):
            got[i] = llm.generate(prompt, max_tokens=12, temperature=0, lora=asks[i])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == solo
        assert llm.engine.shared_steps > 0


@pytest.mark.real_model
def test_a_prompt_never_reuses_cells_of_other_scales(files):
    with elelem.LLM(files["smollm"], lora=[(files["smollm_a"], 1.0)], n_ctx=256, n_threads=THREADS,
                    speculative=False) as llm:
        prompt = "Once upon a time, in a land far away, there lived a"

        def reused(**kw):
            stream = llm.stream(prompt, max_tokens=4, temperature=0, **kw)
            stream.text()
            return stream.reused_tokens
        assert reused() == 0
        assert reused() > 0                     # the same scales: the prefix is reused
        assert reused(lora=[0.0]) == 0          # other scales: evaluated afresh
        llm.set_lora([0.0])
        assert reused() > 0                     # the model alone, as the call before


# -- bad adapters: a clear error ------------------------------------------------------

def _write(tmp_path, name, arch, targets, **kw):
    path = tmp_path / f"{name}.gguf"
    write_lora(path, arch, targets, **kw)
    return path


def test_bad_adapters_are_refused_naming_the_problem(tiny_model, tmp_path):
    path, _ = tiny_model(TinyConfig(arch="qwen2", seed=4))
    shapes = weight_shapes(path)
    q = {"blk.0.attn_q.weight": shapes["blk.0.attn_q.weight"]}
    cases = [
        (_write(tmp_path, "arch", "llama", q), r"the adapter is for a 'llama' model; this model is 'qwen2'"),
        (_write(tmp_path, "shape", "qwen2", {"blk.0.attn_q.weight": (64, 32)}),
         r"blk\.0\.attn_q\.weight\.lora_a \[32, 8\] and \.lora_b \[8, 64\] do not fit the model's "
         r"blk\.0\.attn_q\.weight \[64, 64\]"),
        (_write(tmp_path, "experts", "qwen2", {"blk.0.attn_q.weight": (2, 64, 64)}), r"do not fit"),
        (_write(tmp_path, "missing", "qwen2", {"blk.7.attn_q.weight": (64, 64)}),
         r"changes 'blk\.7\.attn_q\.weight', which this model does not have"),
        (_write(tmp_path, "norm", "qwen2", {"blk.0.attn_norm.weight": (64, 64)}),
         r"changes 'blk\.0\.attn_norm\.weight', which this model does not multiply"),
        (_write(tmp_path, "vector", "qwen2", q, adapter_type="control_vector"), r"only 'lora' adapters"),
        (path, r"general\.type is None, not 'adapter': this is not a LoRA adapter \(it looks like a model\)"),
    ]
    for bad, message in cases:
        with pytest.raises(AdapterError, match=message):
            elelem.LLM(path, lora=[bad])


def test_the_native_loader_checks_shapes_too(tiny_model, tmp_path):
    # elelem._core.open_adapter, given a file the Python checks would refuse: an error, never a crash.
    from elelem import _core
    path, _ = tiny_model(TinyConfig(arch="qwen2", seed=4))
    with elelem.LLM(path) as llm:
        bad = _write(tmp_path, "shape", "qwen2", {"blk.0.attn_q.weight": (64, 32)})
        with pytest.raises(AdapterError, match=r"do not fit the model's blk\.0\.attn_q\.weight \(64, 64\)"):
            _core.open_adapter(llm._model, bad, 8.0)
        half = tmp_path / "half.gguf"
        import gguf
        writer = gguf.GGUFWriter(str(half), "qwen2")
        writer.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((8, 64), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(AdapterError, match=r"lacks its lora_b"):
            _core.open_adapter(llm._model, half, 8.0)


def test_scales_are_checked(tiny_model, tmp_path):
    path, _ = tiny_model(TinyConfig(arch="qwen2", seed=4))
    shapes = weight_shapes(path)
    lora = _write(tmp_path, "ok", "qwen2", {"blk.0.attn_q.weight": shapes["blk.0.attn_q.weight"]})
    with pytest.raises(InvalidArgumentError, match="lora takes paths or"):
        elelem.LLM(path, lora=[(lora, 1.0, 2.0)])
    with elelem.LLM(path, lora=[lora]) as llm:
        for bad, message in [({3: 1.0}, r"no LoRA adapter has id 3 \(ids 0\.\.0\)"), ([1.0, 2.0], r"2 lora scales for 1"),
                             ([float("nan")], "finite"), ({0: "x"}, "finite")]:
            with pytest.raises(InvalidArgumentError, match=message):
                llm.set_lora(bad)
            with pytest.raises(InvalidArgumentError, match=message):
                llm.generate([1, 2, 3], max_tokens=1, lora=bad)
        assert llm.lora_adapters == [{"id": 0, "path": str(lora), "name": "tiny-lora", "scale": 1.0,
                                      "alpha": 16.0, "targets": 1, "task_name": "", "prompt_prefix": ""}]


@pytest.mark.real_model
def test_compat_llama_takes_lora_path_and_lora_scale(files, llamacpp_lora):
    from elelem.compat import Llama
    want = llamacpp_lora["smollm_lora_path"]["rows"]
    with Llama(str(files["smollm"]), lora_path=str(files["smollm_a"]), lora_scale=0.5, n_ctx=256,
               n_threads=THREADS, logits_all=True, verbose=False, elelem_options=elelem_kernel_options()) as llm:
        assert (llm.lora_path, llm.lora_scale) == (str(files["smollm_a"]), 0.5)
        llm.eval(TOKENS[:N_PROMPT])
        got = [row_digest(row) for row in llm.scores[:N_PROMPT]]
    assert got == [r["sha256"] for r in want[:N_PROMPT]]


@pytest.mark.real_model
def test_the_command_line_applies_lora_scaled(files):
    import subprocess
    import sys
    from pathlib import Path
    prompt = "The capital of France is"
    with elelem.LLM(files["smollm"], lora=[(files["smollm_a"], 2.0)], n_threads=1) as llm:
        want = llm.generate(prompt, max_tokens=8, temperature=0)
    result = subprocess.run([sys.executable, "-m", "elelem", "run", "-m", str(files["smollm"]), "-t", "1", "--raw",
                             "--temperature", "0", "-n", "8", "--lora-scaled", f"{files['smollm_a']}:2", prompt],
                            capture_output=True, text=True, timeout=180, cwd=Path(elelem.__file__).parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == want.rstrip("\n")


# -- elelem's own fast paths with an adapter: the experts kernel, small-batch kernels, widened copies --

@pytest.mark.parametrize("expert_type", ["q4_k", "q6_k"])
def test_the_fast_paths_keep_ggml_s_numbers_with_an_adapter(tiny_model, tmp_path, expert_type, small_batch_isa):
    from kernel_choice import through_ggml_alone
    cfg = TinyConfig(arch="qwen3moe", head_dim=32, n_embd=512, n_ff_exp=256, n_expert=8, n_expert_used=3,
                     wtype="q8_0", seed=7, wtypes=(("output.weight", "q8_0"), ("attn_v.weight", "q5_0"),
                                                    ("attn_q.weight", "q4_1")) + tuple(
        (f"{r}_exps.weight", expert_type) for r in ("ffn_gate", "ffn_up", "ffn_down")))
    path, _ = tiny_model(cfg)
    shapes = weight_shapes(path)
    targets = ["blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.0.attn_v.weight",
               "blk.1.attn_q.weight", "output.weight"]
    write_lora(tmp_path / "a.gguf", "qwen3moe", {n: shapes[n] for n in targets}, rank=8, seed=4, dtype="f16")
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, cfg.n_vocab, 5 + s).tolist() for s in range(6)]
    generated = rng.integers(0, cfg.n_vocab, 6).tolist()
    scales = [(0.5,), (0.0,), (1.0,), (-0.5,), (0.5,), (2.0,)]

    def rows():
        with elelem.LLM(path, lora=[tmp_path / "a.gguf"], n_threads=3, n_seq_max=6, flash_attn=True, amx=False,
                        kv_size=512, widen=True) as llm:
            ctx = llm.engine.context
            for s, sc in enumerate(scales):
                ctx.set_lora_scales(s, sc)
            got = [ctx.decode(p, [s] * len(p), True) for s, p in enumerate(prompts)]
            got.append(ctx.decode(generated, list(range(6)), True, decode_kernels=True))
            ops = ctx.step_ops()
            got.append(ctx.decode(generated[:1], [0], True, decode_kernels=True))
            return np.concatenate(got), ops

    fast, ops = rows()
    if cpu_backend_info()["small_batch_kernels"]:
        assert ops.get("CUSTOM", 0) > 0          # elelem's kernels ran in the batched step
    np.testing.assert_array_equal(fast, through_ggml_alone(rows))
