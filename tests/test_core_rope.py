"""RoPE variants against the NumPy reference: linear scaling, partial rotary
(rope.dimension_count < head size), both with llama3-style frequency factors;
scaling types elelem does not implement are refused.

The hyperparameters are read as llama.cpp reads them (llama-model.cpp,
llama-context.cpp): rope.scaling.type defaults to linear; the factor comes
from rope.scaling.factor, else the older rope.scale_linear; type "none"
ignores it.  Positions go to 300, where a wrong scale or a rotated tail shows
plainly (at 4-9 tokens it barely would).

Tolerance: F32 weights and cache, so only float32 rounding remains: measured
max 2.8e-7 of the largest logit over these cases (and 7.1e-7 over the long
contexts of test_core_long_context.py); the bound is 5e-6.  Each case also
checks that the reference without the feature is far outside that bound.
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.errors import ModelShapeError
from synthetic import TinyConfig, prompt_then_decode, reference_logits, write_model

F32_TOLERANCE = 5e-6
TOKENS = np.random.default_rng(3).integers(0, 96, 304)
N_PROMPT = 300
N_CTX = 320

CASES = {
    "qwen2-linear": TinyConfig(rope_linear=4.0),
    "llama-linear": TinyConfig(arch="llama", rope_linear=4.0),
    "qwen2-partial": TinyConfig(n_rot=8),                 # 8 of 16 dims rotate
    "llama-partial": TinyConfig(arch="llama", n_rot=8),
    "llama-partial-linear-freqs": TinyConfig(arch="llama", n_rot=8, rope_linear=2.0, rope_freqs=True),
}


def _without_the_feature(cfg: TinyConfig) -> TinyConfig:
    return cfg.but(rope_linear=0.0) if cfg.rope_linear else cfg.but(n_rot=None)


def _max_error(got, want) -> float:
    return np.abs(got - want).max() / np.abs(want).max()


@pytest.mark.parametrize("name", CASES)
def test_rope_variant_matches_reference_at_long_positions(tiny_model, name):
    cfg = CASES[name]
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, TOKENS)
    # One thread: on models this small ggml's thread barriers cost more than the work.
    with elelem.LLM(path, kv_type="f32", n_ctx=N_CTX, n_threads=1) as llm:
        assert llm.spec.hparams["n_rot"] == cfg.rot
        got = prompt_then_decode(llm, TOKENS, N_PROMPT)
    assert _max_error(got, want) <= F32_TOLERANCE
    # Weights do not depend on the RoPE fields, so the same file serves the control.
    ignored = reference_logits(weights, _without_the_feature(cfg), TOKENS)
    assert _max_error(got, ignored) > 100 * F32_TOLERANCE


@pytest.mark.parametrize("keys", [
    (("{arch}.rope.scaling.factor", 4.0),),   # no type: linear, as in llama.cpp
    (("{arch}.rope.scale_linear", 4.0),),     # the older key
    (("{arch}.rope.scaling.type", "linear"), ("{arch}.rope.scaling.factor", 4.0)),
], ids=["factor-without-type", "old-key", "typed"])
def test_linear_scaling_is_read_as_llama_cpp_reads_it(tiny_model, keys):
    path, weights = tiny_model(TinyConfig(extra_keys=keys))
    with elelem.LLM(path, kv_type="f32", n_ctx=N_CTX, n_threads=1) as llm:
        assert llm.spec.hparams["rope_scale"] == 0.25
        got = llm.eval(TOKENS[:N_PROMPT], all_logits=True)
    want = reference_logits(weights, TinyConfig(rope_linear=4.0), TOKENS[:N_PROMPT])
    assert _max_error(got, want) <= F32_TOLERANCE


def test_scaling_type_none_ignores_the_factor(tiny_model):
    keys = (("{arch}.rope.scaling.type", "none"), ("{arch}.rope.scaling.factor", 4.0))
    path, _ = tiny_model(TinyConfig(extra_keys=keys))
    with elelem.LLM(path) as llm:
        assert llm.spec.hparams["rope_scale"] == 1.0


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
def test_unimplemented_scaling_types_are_refused_naming_the_key(tiny_model, kind):
    """LongRoPE changes every frequency band: running it as unscaled would
    give wrong tokens silently, so it is refused (YaRN is implemented)."""
    keys = (("{arch}.rope.scaling.type", kind), ("{arch}.rope.scaling.factor", 4.0),
            ("{arch}.rope.scaling.original_context_length", 512))
    path, _ = tiny_model(TinyConfig(extra_keys=keys))
    with pytest.raises(ModelShapeError, match=rf"qwen2\.rope\.scaling\.type = '{kind}' is not supported"):
        elelem.LLM(path)


@pytest.mark.parametrize("factor, rule", [(-2.0, "positive"), (float("inf"), "finite"), (float("nan"), "finite")])
def test_bad_linear_factor_is_refused(tiny_model, factor, rule):
    path, _ = tiny_model(TinyConfig(extra_keys=(("{arch}.rope.scaling.factor", factor),)))
    with pytest.raises(ModelShapeError, match=rf"qwen2\.rope\.scaling\.factor = .* must be a {rule} number"):
        elelem.LLM(path)


def test_gemma3_linear_scaling_leaves_the_sliding_layers_unscaled(tiny_model):
    # Gemma 3 4B/12B/27B ship with rope.scaling.type=linear, factor 8.
    cfg = TinyConfig(arch="gemma3", head_dim=32, n_layer=7, n_swa=5, tied=True, rope_linear=8.0)
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, TOKENS[:40], ggml_numerics=True)
    with elelem.LLM(path, kv_type="f32", n_threads=1) as llm:
        got = llm.eval(TOKENS[:40], all_logits=True)
    assert _max_error(got, want) <= 2e-4  # the gemma3 bound of test_core_long_context.py
