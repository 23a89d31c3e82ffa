"""Mixture-of-experts models (qwen3moe, gpt-oss, glm4moe): what the engine
does with them, on tiny synthetic models written as llama.cpp's converter
writes them (tests/support/synthetic.py).  Their logits against llama.cpp are
tests/test_arch_llamacpp.py's; against NumPy, tests/test_moe_reference.py's.
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.errors import ModelShapeError
from elelem.cpu import cpu_backend_info
from kernel_choice import small_batch_isa, through_ggml_alone  # noqa: F401 (a fixture)
from synthetic import TinyConfig

QWEN3MOE = TinyConfig(arch="qwen3moe", head_dim=32, n_layer=2, seed=5)
GPT_OSS = TinyConfig(arch="gpt-oss", head_dim=32, n_layer=2, n_swa=8, seed=6)
GLM4MOE = TinyConfig(arch="glm4moe", head_dim=32, n_rot=16, n_layer=3, seed=7)


# -- bad input: a clear error before any compute ------------------------------------

@pytest.mark.parametrize("cfg, message", [
    (QWEN3MOE.but(extra_keys=(("{arch}.expert_used_count", 9),)),
     r"qwen3moe\.expert_used_count = 9 must be in 1\.\.qwen3moe\.expert_count \(8\)"),
    (QWEN3MOE.but(extra_keys=(("{arch}.expert_count", 0),)), r"qwen3moe\.expert_count = 0 must be in 1\.\.512"),
    (QWEN3MOE.but(drop=("blk.1.ffn_gate_inp.weight",)), r"required tensor 'blk\.1\.ffn_gate_inp\.weight' is missing"),
    (QWEN3MOE.but(cut=(("blk.0.ffn_up_exps.weight", 1, 16),)),
     r"tensor 'blk\.0\.ffn_up_exps\.weight' \(ffn_up_exps\) has shape \[64, 16, 8\], expected \[64, 32, 8\]"),
    (QWEN3MOE.but(cut=(("blk.0.ffn_down_exps.weight", 0, 7),)),
     r"tensor 'blk\.0\.ffn_down_exps\.weight' \(ffn_down_exps\) has shape \[32, 64, 7\], expected \[32, 64, 8\]"),
    (GPT_OSS.but(drop=("blk.1.attn_sinks.weight",)), r"required tensor 'blk\.1\.attn_sinks\.weight' is missing"),
    (GPT_OSS.but(drop=("blk.0.ffn_down_exps.bias",)), r"required tensor 'blk\.0\.ffn_down_exps\.bias' is missing"),
    (GLM4MOE.but(drop=("blk.2.exp_probs_b.bias",)), r"required tensor 'blk\.2\.exp_probs_b\.bias' is missing"),
    (GLM4MOE.but(drop=("blk.0.ffn_up.weight",)), r"required tensor 'blk\.0\.ffn_up\.weight' is missing"),
    (GLM4MOE.but(extra_keys=(("{arch}.nextn_predict_layers", 4),)),
     r"nextn_predict_layers = 4 must be below block_count = 4"),
    (GPT_OSS.but(extra_keys=(("{arch}.rope.scaling.type", "longrope"),)), r"'longrope' is not supported"),
], ids=["used-above-count", "no-experts", "no-router", "expert-width", "expert-count", "no-sinks",
        "no-expert-bias", "no-selection-bias", "no-dense-lead-ffn", "nextn-too-many", "longrope"])
def test_a_broken_moe_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


def test_the_expert_counts_are_reported(tiny_model):
    path, _ = tiny_model(QWEN3MOE)
    with elelem.LLM(path) as llm:
        h = llm.spec.hparams
        assert (h["n_expert"], h["n_expert_used"], h["n_ff_exp"]) == (8, 2, 32)
        total, active = llm.spec.parameter_counts(llm.gguf.tensors)
        experts = 2 * 3 * 8 * 64 * 32          # two layers of 8 experts' gate, up, down
        assert total - active == experts * 6 // 8  # a token reads 2 of the 8
        assert "8 experts (2 used)" in llm.spec.description


# -- batching: every sequence gets its solo logits ---------------------------------

def _steps_against_one_token_steps(ctx, n_vocab, widths):
    """Steps of generated tokens of two interleaved sequences against the same
    tokens one step each (as streams and their drafts share a step)."""
    rng = np.random.default_rng(4)
    for seq in (0, 1):
        prompt = rng.integers(0, n_vocab, 9 + seq).tolist()
        ctx.decode(prompt, [seq] * len(prompt))
    bases = [ctx.cache.seq_length_of(seq) for seq in (0, 1)]
    for n in widths:
        tokens = rng.integers(0, n_vocab, n).tolist()
        seqs = [i % 2 for i in range(n)]
        alone = np.concatenate([ctx.decode([t], [s], True) for t, s in zip(tokens, seqs)])
        for seq in (0, 1):
            ctx.cache.seq_rm(seq, bases[seq])
        together = ctx.decode(tokens, seqs, True, decode_kernels=True)
        for seq in (0, 1):
            ctx.cache.seq_rm(seq, bases[seq])
        np.testing.assert_array_equal(together, alone, err_msg=f"a step of {n}")


# Q4_0 experts are repacked by ggml's CPU backend (CPU_REPACK), whose
# mul_mat_id takes 4 or more of an expert's tokens through a gemm that
# rounds otherwise than the one-token gemv; Q8_0 and MXFP4 ones stay plain.
@pytest.mark.parametrize("expert_type", ["q4_0", "q8_0", "mxfp4"])
@pytest.mark.parametrize("cfg", [QWEN3MOE, GPT_OSS, GLM4MOE], ids=["qwen3moe", "gpt-oss", "glm4moe"])
def test_sequences_routed_to_different_experts_in_one_step_get_their_solo_logits(tiny_model, cfg, expert_type):
    # Q8_0 elsewhere (tinyBLAS gives a column the same numbers in a product of any
    # width); the router stays F32, as converters write it.
    cfg = cfg.but(n_embd=128, wtype="q8_0", wtypes=(("output.weight", "q8_0"),) + tuple(
        (f"{r}_exps.weight", expert_type) for r in ("ffn_gate", "ffn_up", "ffn_down")))
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, flash_attn=True, amx=False, kv_size=512) as llm:
        if expert_type == "q4_0":
            assert llm.repacked.get("CPU_REPACK", 0) >= 3 * (cfg.n_layer - (cfg.arch == "glm4moe")), llm.repacked
        ctx = llm.engine.context
        _steps_against_one_token_steps(ctx, cfg.n_vocab, (1, 2, 3, 4, 5, 8, 9, 16, 20))
        ctx.cache.seq_rm(0, 0)
        ctx.cache.seq_rm(1, 0)
        # Prompts arriving together: one step of three sequences' prompts.
        rng = np.random.default_rng(9)
        prompts = [rng.integers(0, cfg.n_vocab, n).tolist() for n in (11, 6, 17)]
        alone = []
        for prompt in prompts:
            alone.append(ctx.decode(prompt, [0] * len(prompt))[-1])
            ctx.cache.seq_rm(0, 0)
        together = ctx.decode([t for p in prompts for t in p], [s for s, p in enumerate(prompts) for _ in p])
        for s, row in enumerate(together):
            np.testing.assert_array_equal(row, alone[s], err_msg=f"sequence {s}")
        # the routing really differs between the tokens of a step
        assert ctx.step_ops().get("MUL_MAT_ID", 0) >= 3


# Q6_K (and other K-quant or IQ) experts stay plain, and ggml's mul_mat_id
# takes an expert's rows through its tiled kernel once 8 of the step's rows
# chose it, through vec_dot below: the final hidden state (before any
# quantization rounds small differences away) shows it.  Every expert here
# is chosen by every token.
def test_k_quant_experts_give_every_row_its_solo_numbers_in_any_step(tiny_model):
    cfg = QWEN3MOE.but(n_embd=256, n_ff_exp=256, n_expert=2, n_expert_used=2, wtype="q8_0", wtypes=(
        ("output.weight", "q6_k"),) + tuple((f"{r}_exps.weight", "q6_k") for r in ("ffn_gate", "ffn_up", "ffn_down")))
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=16, flash_attn=True, amx=False, kv_size=1024) as llm:
        ctx = llm.engine.context
        if 8 not in ctx.width_thresholds:
            pytest.skip("ggml's tiled K-quant kernel does not run on this CPU")
        rng = np.random.default_rng(4)
        for seq in range(16):
            prompt = rng.integers(0, cfg.n_vocab, 9 + seq).tolist()
            ctx.decode(prompt, [seq] * len(prompt))
        bases = [ctx.cache.seq_length_of(seq) for seq in range(16)]

        def rewind():
            for seq in range(16):
                ctx.cache.seq_rm(seq, bases[seq])

        for n in (7, 8, 9, 16):   # generated tokens of n sequences: one-token steps' numbers
            tokens = rng.integers(0, cfg.n_vocab, n).tolist()
            seqs = rng.permutation(16)[:n].tolist()
            for embeddings in (True, False):
                alone = np.concatenate([ctx.decode([t], [s], True, embeddings=embeddings)
                                        for t, s in zip(tokens, seqs)])
                rewind()
                together = ctx.decode(tokens, seqs, True, embeddings=embeddings, decode_kernels=True)
                rewind()
                np.testing.assert_array_equal(together, alone, err_msg=f"a step of {n}, embeddings={embeddings}")
        for seq in range(16):
            ctx.cache.seq_rm(seq, 0)
        for lengths in ((5, 6), (3, 3, 3), (11, 6, 17)):   # prompts arriving together: their own steps' numbers
            prompts = [rng.integers(0, cfg.n_vocab, n).tolist() for n in lengths]
            for outputs in (None, True):
                for embeddings in (True, False):
                    alone = []
                    for prompt in prompts:
                        alone.append(ctx.decode(prompt, [0] * len(prompt), outputs, embeddings=embeddings))
                        ctx.cache.seq_rm(0, 0)
                    together = ctx.decode([t for p in prompts for t in p],
                                          [s for s, p in enumerate(prompts) for _ in p], outputs, embeddings=embeddings)
                    for s in range(len(prompts)):
                        ctx.cache.seq_rm(s, 0)
                    alone = np.concatenate([a if outputs else a[-1:] for a in alone])
                    np.testing.assert_array_equal(together, alone,
                                                  err_msg=f"prompts {lengths}, outputs={outputs}, embeddings={embeddings}")


# Repacked Q4_K experts and (with AVX-512) Q6_K ones take elelem's experts
# kernel (kernels/experts.h) in steps of generated tokens, and repacked Q4_K
# in prompts too: each chosen expert read once for all the rows that chose it,
# each row with ggml's one-column numbers, so ggml's own mul_mat_id's logits.
# 3 of 8 experts a token over 6 streams: experts chosen by 0 to 6 rows, split
# unevenly between three threads.
@pytest.mark.parametrize("expert_type", ["q4_k", "q6_k"])
def test_the_experts_kernel_gives_ggml_s_logits_bit_for_bit(tiny_model, expert_type, small_batch_isa):
    cfg = QWEN3MOE.but(n_embd=512, n_ff_exp=256, n_expert=8, n_expert_used=3, wtype="q8_0", wtypes=(
        ("output.weight", "q8_0"),) + tuple((f"{r}_exps.weight", expert_type) for r in ("ffn_gate", "ffn_up", "ffn_down")))
    path, _ = tiny_model(cfg)
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, cfg.n_vocab, 5 + s).tolist() for s in range(6)]
    generated = rng.integers(0, cfg.n_vocab, 6).tolist()
    backend = cpu_backend_info()
    served = backend["small_batch_kernels"] and (
        ("CPU_REPACK" in backend["extra_buffer_types"]) if expert_type == "q4_k" else small_batch_isa == "avx512")

    def rows():
        with elelem.LLM(path, n_threads=3, n_seq_max=6, flash_attn=True, amx=False, kv_size=512) as llm:
            ctx = llm.engine.context
            got = [ctx.decode(p, [s] * len(p), True) for s, p in enumerate(prompts)]
            prompt_ops = ctx.step_ops()
            got.append(ctx.decode(generated, list(range(6)), True, decode_kernels=True))
            step_ops = ctx.step_ops()
            got.append(ctx.decode(generated[:1], [0], True, decode_kernels=True))
            return np.concatenate(got), {"prompt": prompt_ops, "step": step_ops, **step_ops, **prompt_ops}

    kernels, ops = rows()
    assert ops["step"].get("MUL_MAT_ID", 0) == (0 if served else 3 * cfg.n_layer)
    assert ops["prompt"].get("MUL_MAT_ID", 0) == (0 if served and expert_type == "q4_k" else 3 * cfg.n_layer)
    np.testing.assert_array_equal(kernels, through_ggml_alone(rows))


# -- speculative decoding and the prompt cache -----------------------------------------

LOOPY = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
LONG = list(range(10, 90)) * 2 + LOOPY     # past the prompt cache's 128-token minimum


@pytest.mark.parametrize("cfg", [QWEN3MOE, GPT_OSS], ids=["qwen3moe", "gpt-oss"])
def test_prompt_lookup_and_the_prompt_cache_leave_greedy_tokens_unchanged(tiny_model, tmp_path, cfg):
    from elelem.engine.step_costs import StepCosts

    path, _ = tiny_model(cfg.but(wtypes=(("ffn_up_exps.weight", "q4_0"), ("ffn_gate_exps.weight", "q4_0"))))
    with elelem.LLM(path, n_threads=2, speculative=False) as plain:
        want = [plain.generate_tokens(prompt, 24) for prompt in (LOOPY, LONG)]
        plain_tail = plain.generate_tokens(LONG[:-2] + [50, 51], 24)
    with elelem.LLM(path, n_threads=2, speculative=True, prompt_cache=tmp_path) as fast:
        fast.engine.step_costs = StepCosts.flat()   # verify every proposal, whatever it costs here
        got = [fast.generate_tokens(prompt, 24) for prompt in (LOOPY, LONG)]
        assert fast.engine.accepted_tokens > 0
    assert got == want
    with elelem.LLM(path, n_threads=2, speculative=False, prompt_cache=tmp_path) as cached:
        assert cached.generate_tokens(LONG[:-2] + [50, 51], 24) == plain_tail
        assert cached.engine.prompt_cache.hits == 1


def test_info_shows_the_experts_and_the_active_parameters(tiny_model):
    from elelem.cli.info_cmd import describe

    path, weights = tiny_model(QWEN3MOE.but(n_embd=256, n_ff_exp=128))
    facts = describe(path)
    assert (facts["experts"], facts["experts_used"]) == (8, 2)
    experts = sum(a.size for name, a in weights.items() if "_exps." in name)
    assert facts["parameters"] == sum(a.size for a in weights.values())
    assert facts["active_parameters"] == facts["parameters"] - experts * 6 // 8
    dense, _ = tiny_model(TinyConfig())
    assert describe(dense)["experts"] is None
    assert describe(dense)["active_parameters"] == describe(dense)["parameters"]
