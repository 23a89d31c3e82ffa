"""Seed-OSS (seed_oss), SmolLM3 (smollm3) and MiniMax-M2 (minimax-m2): what
is particular to each, on tiny synthetic models written as llama.cpp's
converter writes them (tests/support/synthetic.py).  Their logits against
llama.cpp are tests/test_arch_llamacpp.py's (flash attention off and on);
against the NumPy reference, tests/test_core_forward.py's ARCH_CASES.

- bad files are refused with a ModelShapeError naming the key or tensor,
  before anything is computed;
- the graph has the ops each architecture's llama.cpp graph has (SmolLM3's
  NoPE layers rotate nothing; MiniMax-M2 norms Q and K whole);
- prompts arriving together in one step each get their solo logits, with
  flash attention off and on;
- ``elelem info`` shows each family's shape.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import elelem
from elelem.errors import ModelShapeError
from elelem.gguf.reader import read_gguf
from elelem.model.architectures import model_spec
from synthetic import TinyConfig

SEED_OSS = TinyConfig(arch="seed_oss", head_dim=32, n_layer=3, seed=21)
SMOLLM3 = TinyConfig(arch="smollm3", n_layer=8, seed=22)
MINIMAX = TinyConfig(arch="minimax-m2", head_dim=32, n_rot=16, n_layer=3, n_ff=32, seed=23)
CONFIGS = {"seed_oss": SEED_OSS, "smollm3": SMOLLM3, "minimax-m2": MINIMAX}


# -- bad input: a clear error before any compute ------------------------------------

@pytest.mark.parametrize("cfg, message", [
    (SEED_OSS.but(drop=("blk.1.post_attention_norm.weight",)),
     r"required tensor 'blk\.1\.post_attention_norm\.weight' is missing"),
    (SEED_OSS.but(cut=(("blk.0.attn_k.bias", 0, 32),)),
     r"tensor 'blk\.0\.attn_k\.bias' \(bk\) has shape \[32\], expected \[64\]"),
    (SEED_OSS.but(drop=("blk.2.attn_q.bias",)), r"layer 2: Q and K must both have, or both lack, biases"),
    (SEED_OSS.but(n_rot=16), r"seed_oss: .*rope\.dimension_count = 16 must be equal"),
    (SMOLLM3.but(drop=("blk.3.attn_v.weight",)), r"required tensor 'blk\.3\.attn_v\.weight' is missing"),
    (SMOLLM3.but(cut=(("blk.7.ffn_up.weight", 0, 100),)),
     r"tensor 'blk\.7\.ffn_up\.weight' \(ffn_up\) has shape \[64, 100\], expected \[64, 128\]"),
    (SMOLLM3.but(head_dim=32, n_rot=16), r"smollm3: attention\.key_length = 32, .* must be equal"),
    (MINIMAX.but(drop=("blk.1.attn_k_norm.weight",)), r"required tensor 'blk\.1\.attn_k_norm\.weight' is missing"),
    # a per-head norm (Qwen3's shape) where MiniMax-M2 norms all heads together
    (MINIMAX.but(cut=(("blk.0.attn_q_norm.weight", 0, 32),)),
     r"tensor 'blk\.0\.attn_q_norm\.weight' \(q_norm_all\) has shape \[32\], expected \[128\]"),
    (MINIMAX.but(drop=("blk.2.exp_probs_b.bias",)), r"required tensor 'blk\.2\.exp_probs_b\.bias' is missing"),
    (MINIMAX.but(drop=("output.weight",)), r"required tensor 'output\.weight' is missing"),
    (MINIMAX.but(n_ff=64),
     r"minimax-m2\.expert_feed_forward_length = 32 differs from minimax-m2\.feed_forward_length = 64"),
    (MINIMAX.but(extra_keys=(("{arch}.expert_used_count", 9),)),
     r"minimax-m2\.expert_used_count = 9 must be in 1\.\.minimax-m2\.expert_count \(8\)"),
    (MINIMAX.but(extra_keys=(("{arch}.attention.value_length", 16),)), r"value_length = 16 must equal"),
], ids=["seed-no-ffn-norm", "seed-k-bias-width", "seed-q-bias-alone", "seed-partial-rope", "smol-no-v",
        "smol-ffn-width", "smol-partial-rope", "mm-no-k-norm", "mm-per-head-q-norm", "mm-no-selection-bias",
        "mm-no-output", "mm-expert-width", "mm-used-above-count", "mm-value-length"])
def test_a_broken_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


class _Without:
    """A GGUF file's header without one key (the writer always writes it)."""

    def __init__(self, gguf, key):
        self._gguf, self._key, self.tensors = gguf, key, gguf.tensors

    def get(self, key, default=None):
        return default if key == self._key else self._gguf.get(key, default)


def test_minimax_without_a_gating_function_is_refused(tiny_model):
    # llama.cpp reads it with no default and aborts in build_moe_ffn without one
    path, _ = tiny_model(MINIMAX)
    with pytest.raises(ModelShapeError, match=r"minimax-m2\.expert_gating_func is missing"):
        model_spec(_Without(read_gguf(path), "minimax-m2.expert_gating_func"))


# -- the graph: llama.cpp's ops -------------------------------------------------------

def _step_ops(path, **options) -> dict:
    with elelem.LLM(path, n_threads=2, **options) as llm:
        llm.eval([1, 2, 3])
        return llm.engine.context.step_ops()


def test_smollm3_rotates_q_and_k_in_all_layers_but_every_fourth(tiny_model):
    path, _ = tiny_model(SMOLLM3)
    with elelem.LLM(path) as llm:
        assert llm.spec.hparams["n_no_rope_layer_step"] == 4
    assert _step_ops(path)["ROPE"] == 2 * 6     # 8 layers, 3 and 7 without RoPE


def test_minimax_norms_q_and_k_over_all_heads(tiny_model):
    path, _ = tiny_model(MINIMAX)
    ops = _step_ops(path)
    # per layer: attn_norm, Q, K, ffn_norm; then the output norm
    assert ops["RMS_NORM"] == 4 * 3 + 1
    assert ops["ROPE"] == 2 * 3


# -- batching: every sequence gets its solo logits ---------------------------------

@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("name", CONFIGS)
def test_prompts_arriving_together_each_get_their_solo_logits(tiny_model, name, flash_attn):
    # Q8_0 matmuls: tinyBLAS gives a column the same numbers in a product of any width.
    cfg = CONFIGS[name].but(n_embd=128, wtype="q8_0")
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, flash_attn=flash_attn, amx=False, kv_size=512) as llm:
        ctx = llm.engine.context
        rng = np.random.default_rng(9)
        prompts = [rng.integers(0, cfg.n_vocab, n).tolist() for n in (11, 6, 17)]
        alone = []
        for prompt in prompts:
            alone.append(ctx.decode(prompt, [0] * len(prompt))[-1])
            ctx.cache.seq_rm(0, 0)
        together = ctx.decode([t for p in prompts for t in p], [s for s, p in enumerate(prompts) for _ in p])
        for s, row in enumerate(together):
            np.testing.assert_array_equal(row, alone[s], err_msg=f"sequence {s}")
        # and one generated token each, in one step, against each alone
        nxt = [int(np.argmax(row)) for row in together]
        both = ctx.decode(nxt, [0, 1, 2], True, decode_kernels=True)
        for s, (prompt, token) in enumerate(zip(prompts, nxt)):
            for seq in range(3):
                ctx.cache.seq_rm(seq, 0)
            ctx.decode(prompt, [s] * len(prompt))
            np.testing.assert_array_equal(ctx.decode([token], [s], True)[0], both[s], err_msg=f"sequence {s}")


# -- elelem info ---------------------------------------------------------------------

@pytest.mark.parametrize("name, shape", [
    ("seed_oss", "head width 32 (4 x 32 = 128 wide Q for n_embd 64)"),
    ("smollm3", "layer pattern: every 4th layer without RoPE (NoPE), 2 of 8: 3, 7"),
    ("minimax-m2", "Q/K RMSNorm over all heads (4 x 32, 2 x 32); RoPE over 16 of 32 dims; "
                   "sigmoid routing with a selection bias"),
])
def test_info_shows_the_familys_shape(tiny_model, name, shape):
    path, _ = tiny_model(CONFIGS[name])
    run = [sys.executable, "-m", "elelem", "info", str(path)]
    text = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^shape +" + re.escape(shape) + "$", text.stdout, re.M), text.stdout
    assert "(supported: yes)" in text.stdout
    facts = json.loads(subprocess.run(run + ["--json"], capture_output=True, text=True, timeout=120).stdout)
    assert facts["architecture"] == name and facts["shape"] == shape
