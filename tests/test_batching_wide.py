"""Steps of generated tokens wider than 8 rows: every row gets, bit for bit,
the logits of its own one-token step.

ggml's CPU kernels change with a product's width (tinyBLAS from 2 columns,
its tiled K-quant kernel from 8, the repacked gemm from 4, flash attention's
tiled kernel from 64 query rows), and each rounds otherwise than the
one-column kernel a one-token step takes; the graph builders keep every row
of a step of generated tokens on one-token numbers whatever its width
(graph/matmul.pxi, graph/blocks.pxi, graph/experts.pxi).  Checked on the
three real models (the weight types that tell the kernels apart: Q4_1, Q8_0,
Q5_0, Q4_K, Q6_K), with flash attention on and off and AMX on and off, and
on synthetic dense, mixture-of-experts (qwen3moe, qwen35moe, lfm2moe, deepseek2's
latent attention) and hybrid files, MoE steps to 128 rows."""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from batched_steps import assert_generated_steps_match_solo
from synthetic import TinyConfig
from synthetic_mla import MLAConfig

WIDTHS = (9, 12, 16, 32)
K_QUANT_EXPERTS = tuple((f"{r}_exps.weight", "q6_k") for r in ("ffn_gate", "ffn_up", "ffn_down"))
SYNTHETIC = {
    # Q4_K (repacked), Q6_K, Q8_0 (tinyBLAS) and F16 (sgemm) weights in one model
    "llama": TinyConfig(arch="llama", n_embd=256, n_ff=512, n_layer=3, wtype="q4_k", seed=41,
                        wtypes=(("output.weight", "q6_k"), ("ffn_down.weight", "q6_k"), ("attn_q.weight", "q8_0"),
                                ("ffn_up.weight", "f16"))),
    "qwen3moe": TinyConfig(arch="qwen3moe", head_dim=32, n_embd=256, n_ff_exp=256, n_expert=4, n_expert_used=2,
                           n_layer=3, wtype="q8_0", seed=42, wtypes=(("output.weight", "q6_k"),) + K_QUANT_EXPERTS),
    "qwen35moe": TinyConfig(arch="qwen35moe", head_dim=32, n_rot=16, n_embd=256, n_ff_exp=256, n_expert=4,
                            n_expert_used=2, n_layer=4, wtype="q8_0", seed=43, wtypes=K_QUANT_EXPERTS),
    "lfm2moe": TinyConfig(arch="lfm2moe", head_dim=64, n_embd=256, n_ff_exp=256, n_expert=4, n_expert_used=2,
                          n_layer=4, layer_types="CCAC", n_dense_lead=1, wtype="q8_0", seed=44,
                          wtypes=K_QUANT_EXPERTS),
    # multi-head latent attention, a leading dense layer, sigmoid routing with a selection bias, a shared expert
    "deepseek2": MLAConfig(seed=45, wtype="q8_0", n_embd=128),
}
FLASH = pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "softmax"])
AMX = pytest.mark.parametrize("amx", [None, False], ids=["amx-default", "no-amx"])


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["smollm_path", "qwen_path", "gemma_path"])
@FLASH
@AMX
def test_real_models_give_each_row_its_one_token_logits(request, model, flash_attn, amx):
    n_seqs = 16   # the engine's default n_seq_max; 32 rows are two drafts of each
    with elelem.LLM(request.getfixturevalue(model), n_threads=2, n_seq_max=n_seqs, kv_size=n_seqs * 64,
                    flash_attn=flash_attn, amx=amx) as llm:
        ctx = llm.engine.context
        assert_generated_steps_match_solo(ctx, ctx.n_vocab, np.random.default_rng(7), WIDTHS, n_seqs)


@pytest.mark.parametrize("arch", list(SYNTHETIC))
@FLASH
def test_synthetic_models_give_each_row_its_one_token_logits(tiny_model, arch, flash_attn):
    cfg = SYNTHETIC[arch]
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=32, kv_size=32 * 64, flash_attn=flash_attn, amx=False) as llm:
        ctx = llm.engine.context
        assert_generated_steps_match_solo(ctx, cfg.n_vocab, np.random.default_rng(8), WIDTHS, 32)
        # drafts of 16 streams, 8 rows each: flash attention's tiled kernel from
        # 64 rows, more groups of rows through the experts than 16
        assert_generated_steps_match_solo(ctx, cfg.n_vocab, np.random.default_rng(9), (64, 70, 128), 16)


@pytest.mark.parametrize("arch", ["qwen3moe"])
@FLASH
def test_moe_steps_of_64_rows_or_more_with_amx(tiny_model, arch, flash_attn):
    """As above with AMX where the CPU has it (the Q8_0 attention and head
    weights then in AMX tiles; the experts stay in the CPU buffer, since AMX
    takes no mul_mat_id): 64 rows and more, one stream each and drafts of 16."""
    cfg = SYNTHETIC[arch]
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=64, kv_size=64 * 64, flash_attn=flash_attn, amx=None) as llm:
        ctx = llm.engine.context
        assert_generated_steps_match_solo(ctx, cfg.n_vocab, np.random.default_rng(11), (64,), 64)
        assert_generated_steps_match_solo(ctx, cfg.n_vocab, np.random.default_rng(12), (64, 128), 16)


def test_rows_whose_one_token_step_splits_its_cells_keep_it_in_a_wide_step(tiny_model):
    """Past FA_SPLIT_CELLS (512) cells a one-token step's flash attention
    splits the cells between the threads; every such row of a wide step takes
    an op of its own over its one-token step's cells, the others the one-row
    kernel in groups of fewer than 64."""
    cfg = SYNTHETIC["llama"]
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, kv_size=4 * 640, n_batch=1024,
                    flash_attn=True, amx=False) as llm:
        ctx = llm.engine.context
        rng = np.random.default_rng(10)
        # two sequences past 512 positions (their rows split), two short ones (theirs do not)
        assert_generated_steps_match_solo(ctx, cfg.n_vocab, rng, (9, 72), 4, prompt_lengths=(530, 531))
        long_and_short = [530, 530, 20, 20]
        for s, n in enumerate(long_and_short):
            prompt = rng.integers(0, cfg.n_vocab, n).tolist()
            ctx.decode(prompt, [s] * n)
        bases = [ctx.cache.seq_length_of(s) for s in range(4)]
        tokens = rng.integers(0, cfg.n_vocab, 80).tolist()
        seqs = [i % 4 for i in range(80)]
        one_each = np.concatenate([ctx.decode([t], [s], True, decode_kernels=True) for t, s in zip(tokens, seqs)])
        for s in range(4):
            ctx.cache.seq_rm(s, bases[s])
        step = ctx.decode(tokens, seqs, True, decode_kernels=True)
        np.testing.assert_array_equal(step, one_each)
