"""deepseek2 (multi-head latent attention) on tiny synthetic models written as
llama.cpp's converter writes them (tests/support/synthetic_mla.py): the NumPy
reference in its two forms, elelem against it, the cache's layout, batching,
and bad files.  The logits against llama.cpp live are
tests/test_arch_llamacpp.py's (its deepseek2_* configs)."""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.cli.info_cmd import describe
from elelem.errors import ModelShapeError
from elelem.gguf.reader import read_gguf
from elelem.model.architectures import model_spec
from batched_steps import assert_steps_match_solo
from synthetic_mla import MLAConfig, mla_attention, reference_logits

GLM = MLAConfig(seed=11)                                   # q_lora_rank, sigmoid, selection bias
LITE = MLAConfig(n_layer=27, q_lora_rank=0, gating="softmax", selection_bias=False, expert_norm=False,
                 expert_scale=0.0, n_expert_shared=2, yarn=4.0, yarn_orig_ctx=16, mscale_all_dim=0.707, seed=12)
TOKENS = [int(t) for t in np.random.default_rng(3).integers(1, 90, 14)]


# -- the NumPy reference: MLA's naive and absorbed forms are one function --------------

@pytest.mark.parametrize("cfg", [GLM, LITE], ids=["q_lora", "lite_yarn"])
def test_naive_and_absorbed_mla_agree(tiny_model, cfg):
    _, w = tiny_model(cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, cfg.n_embd))
    positions = np.arange(9, dtype=np.float64)
    naive = mla_attention(x, w, "blk.1.", cfg, positions, "naive")
    absorbed = mla_attention(x, w, "blk.1.", cfg, positions, "absorbed")
    assert naive.shape == (9, cfg.n_head * cfg.v_head_dim)
    np.testing.assert_allclose(absorbed, naive, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(reference_logits(w, cfg, TOKENS, "naive"), reference_logits(w, cfg, TOKENS),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("cfg", [GLM, LITE], ids=["q_lora", "lite_yarn"])
def test_logits_follow_the_numpy_reference(tiny_model, cfg, flash_attn):
    # F32 weights and an F32 cache: float32 rounding only (measured: 1.5e-6 and 8e-6 at most).
    path, w = tiny_model(cfg)
    want = reference_logits(w, cfg, TOKENS)
    with elelem.LLM(path, kv_type="f32", n_ctx=64, n_threads=2, flash_attn=flash_attn) as llm:
        got = np.asarray(llm.eval(TOKENS, all_logits=True), dtype=np.float64)
        # one token a step: the cached latent read back
        llm.reset()
        llm.eval(TOKENS[:5])
        rows = [llm.eval([t]) for t in TOKENS[5:]]
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(rows[:-1], dtype=np.float64), want[5:-1], atol=5e-5, rtol=0)


# -- the cache: one latent row a cell, V a view of it ---------------------------------

def test_the_cache_holds_the_latent_and_rope_part_once(tiny_model):
    path, _ = tiny_model(GLM)
    for kv_type, size in (("f16", 2), ("f32", 4)):
        with elelem.LLM(path, kv_type=kv_type, n_ctx=64, flash_attn=False) as llm:
            cache = llm.engine.context.cache
            assert cache.v_in_k and not cache.v_trans
            # (kv_lora_rank + n_rot) values a layer, nothing for V; the memory planner counts the same
            assert cache.bytes_per_cell == GLM.n_layer * (GLM.kv_lora_rank + GLM.qk_rope) * size
            assert llm.spec.kv_heads() == (1, GLM.kv_lora_rank + GLM.qk_rope, GLM.kv_lora_rank, False)


def test_a_quantized_cache_turns_flash_attention_on(tiny_model):
    # V is a view of K; without flash attention it is transposed, which blocks cannot be.
    # (Cached rows of 96 and a latent of 64: whole Q8_0 blocks, as real models' 576 and 512.)
    cfg = GLM.but(kv_lora_rank=64, qk_rope=32)
    path, w = tiny_model(cfg)
    with elelem.LLM(path, kv_type="q8_0", n_ctx=64, flash_attn=False) as llm:
        assert llm.engine.context.flash_attn
        got = np.asarray(llm.eval(TOKENS, all_logits=True), dtype=np.float64)
    np.testing.assert_allclose(got, reference_logits(w, cfg, TOKENS), atol=0.05, rtol=0)


def test_a_saved_state_restores_the_same_logits(tiny_model):
    path, _ = tiny_model(GLM)
    with elelem.LLM(path, n_ctx=64, flash_attn=False) as llm:
        llm.eval(TOKENS[:8])
        state = llm.save_state()
        want = llm.eval(TOKENS[8:10])
        llm.reset()
        llm.load_state(state)
        np.testing.assert_array_equal(llm.eval(TOKENS[8:10]), want)


# -- batching: every sequence gets its solo logits ------------------------------------

@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("wtype", ["f32", "q8_0"])
def test_sequences_in_one_step_get_their_solo_logits(tiny_model, wtype, flash_attn):
    cfg = GLM.but(wtype=wtype, n_embd=128)
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, flash_attn=flash_attn, amx=False, kv_size=512) as llm:
        ctx = llm.engine.context
        rng = np.random.default_rng(9)
        # Prompts arriving together: one step of three sequences' prompts (one of a single token:
        # not with F32 weights, whose one-column products elelem, as any architecture, leaves to
        # tinyBLAS in a step of several sequences).
        assert_steps_match_solo(ctx, cfg.n_vocab, rng, (11, 1 if wtype == "q8_0" else 3, 17))


# -- reading: the variants, GLM-4.7-Flash's routing, what info shows ------------------

def test_glm47_flash_routing_is_inferred_from_its_shape(tiny_model):
    """No expert_gating_func: sigmoid for 47 (or 48) layers and 154880 tokens, as llama.cpp infers."""
    for cfg, gating in ((GLM.but(n_layer=47, gating=None, vocab_size_key=154880), 1),
                        (GLM.but(n_layer=47, n_nextn=1, gating=None, vocab_size_key=154880), 1),
                        (GLM.but(n_layer=48, gating=None, vocab_size_key=154880), 1),
                        (GLM.but(n_layer=46, n_nextn=1, gating=None, vocab_size_key=154880), 0),
                        (GLM.but(n_layer=47, gating=None), 0), (GLM.but(gating=None), 0), (GLM, 1),
                        (GLM.but(n_layer=47, gating="softmax", vocab_size_key=154880), 0)):
        path, _ = tiny_model(cfg)
        assert model_spec(read_gguf(path)).hparams["expert_gating"] == gating, cfg


def test_info_shows_the_latent_rank(tiny_model):
    path, _ = tiny_model(GLM)
    facts = describe(path)
    assert facts["supported"], facts["unsupported_reason"]
    assert facts["attention"] == "multi-head latent: kv_lora_rank 32, q_lora_rank 64, 16 RoPE dims, 4 heads of 48 (K) / 32 (V)"
    path, _ = tiny_model(LITE)
    assert "q_lora_rank 0 (Q projected directly)" in describe(path)["attention"]


# -- bad files: a clear error naming the key or tensor, before any compute ------------

@pytest.mark.parametrize("cfg, message", [
    (GLM.but(drop=("blk.1.attn_k_b.weight",)), r"required tensor 'blk\.1\.attn_k_b\.weight' is missing"),
    (GLM.but(drop=("blk.0.attn_kv_a_norm.weight",)), r"required tensor 'blk\.0\.attn_kv_a_norm\.weight' is missing"),
    (GLM.but(drop=("blk.2.attn_q_a.weight",)), r"required tensor 'blk\.2\.attn_q_a\.weight' is missing"),
    (LITE.but(drop=("blk.3.attn_q.weight",)), r"required tensor 'blk\.3\.attn_q\.weight' is missing"),
    (GLM.but(cut=(("blk.1.attn_v_b.weight", 1, 16),)),
     r"tensor 'blk\.1\.attn_v_b\.weight' \(wv_b\) has shape \[32, 16, 4\], expected \[32, 32, 4\]"),
    (GLM.but(cut=(("blk.0.attn_kv_a_mqa.weight", 0, 40),)),
     r"tensor 'blk\.0\.attn_kv_a_mqa\.weight' \(wkv_a_mqa\) has shape \[64, 40\], expected \[64, 48\]"),
    (GLM.but(cut=(("blk.2.attn_k_b.weight", 2, 16),)),
     r"tensor 'blk\.2\.attn_k_b\.weight' \(wk_b\) has shape \[16, 32, 4\], expected \[32, 32, 4\]"),
    (GLM.but(extra_keys=(("{arch}.attention.kv_lora_rank", 48),)),
     r"deepseek2\.attention\.key_length = 48 must be kv_lora_rank \+ rope\.dimension_count = 64"),
    (GLM.but(extra_keys=(("{arch}.attention.value_length", 16),)),
     r"deepseek2\.attention\.value_length = 16 must be kv_lora_rank = 32"),
    (GLM.but(extra_keys=(("{arch}.attention.head_count_kv", 4),)),
     r"deepseek2\.attention\.head_count_kv = 4 must be 1"),
    (GLM.but(extra_keys=(("{arch}.rope.dimension_count", 48),)),
     r"rope\.dimension_count = 48 must leave a no-RoPE part"),
    (GLM.but(drop_keys=("attention.key_length_mla", "attention.value_length_mla")),
     r"key_length_mla is missing: an older conversion with the unsplit attn_kv_b"),
    (GLM.but(drop_keys=("attention.q_lora_rank",)), r"missing hyperparameter deepseek2\.attention\.q_lora_rank"),
    (LITE.but(extra_keys=(("{arch}.attention.q_lora_rank", 0),), drop=("blk.0.attn_q.weight",)),
     r"required tensor 'blk\.0\.attn_q\.weight' is missing"),
    (GLM.but(drop_keys=("attention.kv_lora_rank",)), r"missing hyperparameter deepseek2\.attention\.kv_lora_rank"),
    (GLM.but(expert_groups=4, expert_groups_used=2),
     r"deepseek2\.expert_group_count = 4 .* grouped expert routing .* not supported"),
], ids=["no-k_b", "no-kv_a_norm", "no-q_a", "lite-no-q", "v_b-width", "kv_a-width", "k_b-nope", "kv-rank",
        "value-length", "kv-heads", "rope-too-wide", "legacy-kv_b", "no-q-rank", "q-rank-0-no-q", "no-kv-rank",
        "grouped-routing"])
def test_a_broken_mla_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
def test_generated_tokens_past_512_cells_get_their_one_token_numbers(tiny_model, flash_attn):
    # With one query row over 512 cells or more, ggml's flash attention splits the cells between
    # its threads (graph/blocks.pxi: Step.split_kv); the latent view takes that path too.
    cfg = GLM.but(wtype="q8_0", n_embd=128)
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, flash_attn=flash_attn, amx=False, kv_size=2048) as llm:
        ctx = llm.engine.context
        rng = np.random.default_rng(1)
        for seq, n in ((0, 600), (1, 20), (2, 530)):
            prompt = rng.integers(0, cfg.n_vocab, n).tolist()
            for start in range(0, n, 256):
                ctx.decode(prompt[start:start + 256], [seq] * len(prompt[start:start + 256]))
        bases = [ctx.cache.seq_length_of(s) for s in range(3)]
        for n in (1, 2, 3, 5):
            tokens = rng.integers(0, cfg.n_vocab, n).tolist()
            seqs = [i % 3 for i in range(n)]
            one_each = np.concatenate([ctx.decode([t], [s], True) for t, s in zip(tokens, seqs)])
            for s in range(3):
                ctx.cache.seq_rm(s, bases[s])
            step = ctx.decode(tokens, seqs, True, decode_kernels=True)
            for s in range(3):
                ctx.cache.seq_rm(s, bases[s])
            np.testing.assert_array_equal(step, one_each, err_msg=f"a step of {n}")
