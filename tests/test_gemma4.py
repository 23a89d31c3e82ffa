"""Gemma 4 (gemma4): what the engine does with it, on tiny synthetic models
written as llama.cpp's converter writes them (tests/support/synthetic.py).  Its logits
against llama.cpp are tests/test_arch_llamacpp.py's (bit for bit), against
NumPy tests/test_core_forward.py's; its tokenizer is checked on llama.cpp's
vocabulary test file in tests/test_tokenizer_vocab_files.py.

Two shapes: one like E2B (sliding layers of head 16 and 1 KV head, every
third layer global with head 32 and 2 KV heads; the last three layers reuse the
K/V of layers 1 and 2, with double-width FFNs; per-layer token embeddings), one
like 26B-A4B (experts beside every dense FFN, global layers whose V is K,
layer output scales).
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.errors import ModelShapeError
from synthetic import TinyConfig, gemma4_layers
from test_moe import _steps_against_one_token_steps

E2B = TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=6, n_swa=5, n_head_kv=1, n_head_kv_global=2,
                 n_kv_shared=3, n_embd_per_layer=16, double_ffn=True, softcap=30.0, seed=11)
A4B = TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=4, n_swa=5, swa_every=2, experts=True,
                 k_eq_v=True, layer_scale=True, softcap=30.0, seed=12)
PROMPT = np.random.default_rng(3).integers(0, 96, 20).tolist()


# -- bad input: a clear error before any compute ------------------------------------

@pytest.mark.parametrize("cfg, message", [
    (E2B.but(drop=("per_layer_token_embd.weight",)), r"required tensor 'per_layer_token_embd\.weight' is missing"),
    (E2B.but(drop=("blk.3.inp_gate.weight",)), r"required tensor 'blk\.3\.inp_gate\.weight' is missing"),
    (E2B.but(drop=("rope_freqs.weight",)), r"required tensor 'rope_freqs\.weight' is missing"),
    (E2B.but(drop=("blk.2.attn_k.weight",)), r"required tensor 'blk\.2\.attn_k\.weight' is missing"),
    (E2B.but(cut=(("blk.0.attn_q.weight", 0, 32),)),
     r"tensor 'blk\.0\.attn_q\.weight' \(wq\) has shape \[64, 32\], expected \[64, 64\]"),
    (E2B.but(cut=(("blk.2.attn_k.weight", 1, 32),)),
     r"tensor 'blk\.2\.attn_k\.weight' \(wk\) has shape \[32, 64\], expected \[64, 64\]"),
    (E2B.but(cut=(("blk.4.ffn_up.weight", 0, 128),)),
     r"tensor 'blk\.4\.ffn_up\.weight' \(ffn_up\) has shape \[64, 128\], expected \[64, 256\]"),
    (E2B.but(n_kv_shared=2), r"layer 4 would share the K/V of layer 2, which is not a sliding-window layer"),
    (E2B.but(extra_keys=(("{arch}.attention.shared_kv_layers", 5),)),
     r"gemma4\.attention\.shared_kv_layers = 5 must leave at least 2"),
    (E2B.but(extra_keys=(("{arch}.attention.sliding_window", 0),)),
     r"gemma4\.attention\.sliding_window = 0 must be positive"),
    (E2B.but(extra_keys=(("{arch}.final_logit_softcapping", -1.0),)),
     r"gemma4\.final_logit_softcapping = -1\.0 must not be negative"),
    (A4B.but(drop=("blk.1.ffn_gate_inp.scale",)), r"required tensor 'blk\.1\.ffn_gate_inp\.scale' is missing"),
    (A4B.but(drop=("blk.0.ffn_gate_up_exps.weight",)), r"required tensor 'blk\.0\.ffn_gate_exps\.weight' is missing"),
    (A4B.but(drop=("blk.2.post_ffw_norm_2.weight",)), r"required tensor 'blk\.2\.post_ffw_norm_2\.weight' is missing"),
    (A4B.but(cut=(("blk.0.ffn_gate_up_exps.weight", 1, 32),)),
     r"tensor 'blk\.0\.ffn_gate_up_exps\.weight' \(ffn_gate_up_exps\) has shape \[64, 32, 8\], expected \[64, 64, 8\]"),
    (A4B.but(extra_keys=(("{arch}.expert_count", 0),)), r"gemma4\.expert_count = 0 must be in 1\.\.512"),
], ids=["no-per-layer-table", "no-per-layer-gate", "no-rope-freqs", "no-k", "sliding-q-width", "global-k-width",
        "double-ffn-width", "shared-kv-kind", "shared-kv-too-many", "no-window", "softcap", "no-router-scale", "no-gate-up",
        "no-expert-post-norm", "gate-up-width", "no-experts"])
def test_a_broken_gemma4_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


def test_the_layers_are_read_as_llama_cpp_reads_them(tiny_model):
    path, _ = tiny_model(E2B)
    with elelem.LLM(path) as llm:
        h = llm.spec.hparams
        layers = gemma4_layers(E2B)
        assert h["swa_layers"] == [lay.swa for lay in layers] == [True, True, False, True, True, False]
        assert h["layer_head_dim_k"] == [16, 16, 32, 16, 16, 32]
        assert h["layer_n_head_kv"] == [1, 1, 2, 1, 1, 2]
        assert h["layer_n_ff"] == [128, 128, 128, 256, 256, 256]
        assert h["layer_kv_source"] == [0, 1, 2, 1, 1, 2] == [lay.kv_source for lay in layers]
        assert (h["n_embd_per_layer"], h["final_logit_softcap"], h["attn_scale"]) == (16, 30.0, 1.0)
        # Shared layers own no weights for K and V, and the dense FFN runs beside no experts.
        assert "wk" not in llm.spec.layer_tensors[4] and "ffn_gate_inp" not in llm.spec.layer_tensors[0]


def test_a_file_without_the_final_soft_cap_is_capped_at_30_as_llama_cpp_caps_it(tiny_model):
    """llama.cpp's hparams default final_logit_softcapping to 30 and its gemma4 loader reads the key
    as optional; 0 written in the file turns the cap off."""
    logits = {}
    for name, cap in (("absent", None), ("thirty", 30.0), ("off", 0.0)):
        path, _ = tiny_model(E2B.but(softcap=cap))
        with elelem.LLM(path) as llm:
            assert llm.spec.hparams["final_logit_softcap"] == (30.0 if cap is None else cap)
            logits[name] = llm.eval(PROMPT)
    assert np.array_equal(logits["absent"], logits["thirty"])
    assert not np.array_equal(logits["absent"], logits["off"])
    assert np.abs(logits["absent"]).max() < 30.0


def test_only_the_layers_that_own_k_and_v_get_cache(tiny_model):
    """Shared-K/V layers store nothing: the cache allocates layers 0-2 only,
    K rows of 1x16, 1x16 and 2x32 values; V the same with flash attention,
    else transposed and as wide as the widest layer's (llama.cpp's padding)."""
    path, _ = tiny_model(E2B)
    with elelem.LLM(path, kv_type="f16", n_ctx=256, flash_attn=False) as llm:   # LLM's default, auto: on
        cache = llm.engine.context.cache
        assert (cache.n_layer, cache.n_layer_kv, cache.v_row) == (6, 3, 64)
        assert cache.bytes_per_cell == 2 * (16 + 16 + 64) + 2 * 3 * 64
    with elelem.LLM(path, kv_type="f16", n_ctx=256, flash_attn=True) as llm:
        assert llm.engine.context.cache.bytes_per_cell == 2 * 2 * (16 + 16 + 64)


def test_a_quantized_cache_needs_every_layers_heads_to_fill_its_blocks(tiny_model):
    path, _ = tiny_model(E2B)   # sliding layers' heads are 16 wide, Q8_0 blocks 32
    with pytest.raises(elelem.errors.InvalidArgumentError, match="blocks of 32 values; this model's heads are 16 wide"):
        elelem.LLM(path, kv_type="q8_0")
    path, _ = tiny_model(A4B.but(head_dim=64, head_dim_swa=32))
    with elelem.LLM(path, kv_type="q8_0") as llm:   # flash attention, which a quantized V needs
        whole = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        steps = np.stack([llm.eval([t]) for t in PROMPT])
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-3 * np.abs(whole).max())


@pytest.mark.parametrize("cfg", [E2B, A4B], ids=["e2b", "a4b"])
@pytest.mark.parametrize("flash_attn", [False, True])
def test_token_by_token_equals_one_prompt_step(tiny_model, cfg, flash_attn):
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, kv_type="f32", flash_attn=flash_attn) as llm:
        whole = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        steps = np.stack([llm.eval([t]) for t in PROMPT])
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-4 * np.abs(whole).max())


@pytest.mark.parametrize("cfg", [E2B, A4B], ids=["e2b", "a4b"])
def test_sequences_in_one_step_get_their_solo_logits(tiny_model, cfg):
    """Shared K/V and per-layer embeddings with several sequences in a step:
    steps of generated tokens and prompts arriving together, Q4_0 weights
    (repacked by ggml's CPU backend) and Q8_0 ones."""
    cfg = cfg.but(n_embd=128, n_embd_per_layer=32 if cfg.n_embd_per_layer else 0, wtype="q8_0", wtypes=(("ffn_up.weight", "q4_0"), ("ffn_gate.weight", "q4_0"),
                                                    ("ffn_gate_up_exps.weight", "q4_0")))
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, flash_attn=True, amx=False, kv_size=512) as llm:
        ctx = llm.engine.context
        _steps_against_one_token_steps(ctx, cfg.n_vocab, (1, 2, 3, 4, 5, 8, 9, 16))
        ctx.cache.seq_rm(0, 0)
        ctx.cache.seq_rm(1, 0)
        rng = np.random.default_rng(9)
        prompts = [rng.integers(0, cfg.n_vocab, n).tolist() for n in (11, 6, 17)]
        alone = []
        for prompt in prompts:
            alone.append(ctx.decode(prompt, [0] * len(prompt))[-1])
            ctx.cache.seq_rm(0, 0)
        together = ctx.decode([t for p in prompts for t in p], [s for s, p in enumerate(prompts) for _ in p])
        for s, row in enumerate(together):
            np.testing.assert_array_equal(row, alone[s], err_msg=f"sequence {s}")


LOOPY = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
LONG = list(range(10, 90)) * 2 + LOOPY     # past the prompt cache's 128-token minimum


@pytest.mark.parametrize("cfg", [E2B, A4B], ids=["e2b", "a4b"])
def test_states_prompt_lookup_and_the_prompt_cache_leave_greedy_tokens_unchanged(tiny_model, tmp_path, cfg):
    """A saved state (only the owning layers' K/V), speculative prompt lookup
    and the prompt cache give the tokens plain greedy decoding gives."""
    from elelem.engine.step_costs import StepCosts

    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, speculative=False) as plain:
        want = [plain.generate_tokens(prompt, 16) for prompt in (LOOPY, LONG)]
        plain_tail = plain.generate_tokens(LONG[:-2] + [50, 51], 16)
        plain.reset()
        plain.eval(LOOPY)
        state = plain.save_state()
        assert len(state.kv) == len(LOOPY) * plain.engine.context.cache.bytes_per_cell
        plain.reset()
        plain.eval(LONG[:5])
        plain.load_state(state)
        assert plain.generate_tokens(LOOPY, 16) == want[0]
    with elelem.LLM(path, n_threads=2, speculative=True, prompt_cache=tmp_path) as fast:
        fast.engine.step_costs = StepCosts.flat()   # verify every proposal, whatever it costs here
        got = [fast.generate_tokens(prompt, 16) for prompt in (LOOPY, LONG)]
        assert fast.engine.accepted_tokens > 0
    assert got == want
    with elelem.LLM(path, n_threads=2, speculative=False, prompt_cache=tmp_path) as cached:
        assert cached.generate_tokens(LONG[:-2] + [50, 51], 16) == plain_tail
        assert cached.engine.prompt_cache.hits == 1


# -- Gemma 4's tokenizer and chat template, end to end ---------------------------------

@pytest.mark.real_model   # Gemma 4's vocabulary and template: llama.cpp's ggml-vocab-gemma-4.gguf, from the sdist
def test_thinking_is_switched_per_request_through_the_models_own_template(tmp_path):
    """A tiny gemma4 model with Gemma 4's vocabulary and chat template: the
    template's markup tokenizes to Gemma 4's special tokens, and
    chat_template_kwargs turn thinking on for one request and not the next."""
    import llamacpp_sdist as sdist
    from vocab_metadata import vocab_size, vocab_writer
    from synthetic import write_model

    vocab = sdist.vocab_path("gemma-4")
    cfg = TinyConfig(arch="gemma4", n_embd=32, n_head=2, n_head_kv=1, head_dim=16, head_dim_swa=8, n_ff=32,
                     n_layer=2, swa_every=2, n_swa=4, tied=True, n_vocab=vocab_size(vocab))
    path = tmp_path / "gemma4-vocab.gguf"
    add_vocab = vocab_writer(vocab)
    source = (sdist.templates_dir() / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")

    def add_vocab_and_template(writer):
        add_vocab(writer)
        writer.add_chat_template(source)

    write_model(path, cfg, extra_metadata=add_vocab_and_template)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with elelem.LLM(path, n_ctx=128, n_threads=2) as llm:
        think, turn = llm.tokenize("<|think|>", add_bos=False, special=True), \
            llm.tokenize("<|turn>", add_bos=False, special=True)
        assert len(think) == 1 and len(turn) == 1   # special tokens, not text
        template = llm.chat_template
        for on in (True, False, True):
            text = template.render(messages, add_generation_prompt=True, enable_thinking=on)
            assert ("<|think|>" in text) == on
            ids = llm.tokenize(text, add_bos=False, special=True)
            reply = llm.create_chat_completion(messages, max_tokens=1, chat_template_kwargs={"enable_thinking": on})
            assert reply["usage"]["prompt_tokens"] == len(ids)
            assert ids[0] == llm.tokenizer.bos_id and (think[0] in ids) == on and ids.count(turn[0]) == 3
        with pytest.raises(elelem.errors.InvalidArgumentError, match="chat_template_kwargs cannot set 'messages'"):
            llm.create_chat_completion(messages, max_tokens=1, chat_template_kwargs={"messages": []})
