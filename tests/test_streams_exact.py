"""Batching never changes an answer: 8 and 16 greedy streams arriving at random
times, on dense, mixture-of-experts and hybrid (Gated DeltaNet, short-convolution,
Mamba-2) models, with and without
speculative decoding, each get the tokens they get alone.

The weights are the types that tell kernels apart: Q6_K experts and heads
(ggml's tiled kernel from 8 rows an expert, vec_dot below), Q4_K (repacked:
gemm from 4 columns), MXFP4 experts (gpt-oss), Q8_0 (tinyBLAS).  A step's
composition depends on the threads' timing; whatever it is, every stream
must keep its solo tokens."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import elelem
from synthetic import TinyConfig
from synthetic_mamba2 import Mamba2Config

K_QUANT_EXPERTS = tuple((f"{r}_exps.weight", "q6_k") for r in ("ffn_gate", "ffn_up", "ffn_down"))
MODELS = {
    "llama": TinyConfig(arch="llama", n_embd=256, n_ff=512, n_layer=3, wtype="q4_k", seed=21,
                        wtypes=(("output.weight", "q6_k"), ("ffn_down.weight", "q6_k"))),
    "qwen3moe": TinyConfig(arch="qwen3moe", head_dim=32, n_embd=256, n_ff_exp=256, n_expert=4, n_expert_used=2,
                           n_layer=3, wtype="q8_0", seed=22, wtypes=(("output.weight", "q6_k"),) + K_QUANT_EXPERTS),
    "gpt-oss": TinyConfig(arch="gpt-oss", head_dim=32, n_embd=256, n_ff_exp=256, n_expert=4, n_expert_used=2,
                          n_layer=2, n_swa=16, yarn=4.0, wtype="q8_0", seed=23),
    "qwen35moe": TinyConfig(arch="qwen35moe", head_dim=32, n_rot=16, n_embd=256, n_ff_exp=256, n_expert=4,
                            n_expert_used=2, n_layer=4, wtype="q8_0", seed=24, wtypes=K_QUANT_EXPERTS),
    "lfm2moe": TinyConfig(arch="lfm2moe", head_dim=64, n_embd=256, n_ff_exp=256, n_expert=4, n_expert_used=2,
                          n_layer=4, layer_types="CCAC", n_dense_lead=1, wtype="q8_0", seed=25,
                          wtypes=K_QUANT_EXPERTS),
    # Mamba-2 hybrid with experts (Nemotron-3-Nano's kinds): Mamba-2, experts, attention
    "nemotron_h_moe": Mamba2Config(arch="nemotron_h_moe", n_embd=256, pattern="MEM*E", n_head=4, n_head_kv=2,
                                   head_dim=64, ssm_n_head=8, ssm_head_dim=32, n_expert=4, n_expert_used=2,
                                   n_ff_exp=256, n_ff_shexp=256, wtype="q8_0", seed=26),
}
TOKENS = 24


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tiny_model):
    cfg = MODELS[request.param]
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=17, kv_size=17 * 128, amx=False) as llm:
        yield request.param, cfg, llm


def _prompts(cfg, seed: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(n):
        body = rng.integers(1, cfg.n_vocab, int(rng.integers(3, 40))).tolist()
        if rng.random() < 0.5:   # text that repeats itself: prompt lookup finds drafts
            body = body[:6] * 4 + body
        prompts.append(body)
    return prompts


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n_streams=st.sampled_from([8, 16]), speculative=st.booleans(),
       spread_ms=st.sampled_from([0, 5, 30]))
def test_every_stream_keeps_its_solo_tokens(model, seed, n_streams, speculative, spread_ms):
    arch, cfg, llm = model
    prompts = _prompts(cfg, seed, n_streams)
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(4, TOKENS + 1, n_streams).tolist()
    delays = (rng.random(n_streams) * spread_ms / 1000).tolist()
    solo = []
    session = llm.new_session()
    for prompt, n in zip(prompts, lengths):
        session.reset()
        solo.append(session.generate_tokens(prompt, n))
    session.close()
    llm.engine.speculative = speculative
    sessions = [llm.new_session() for _ in range(n_streams)]
    together: list = [None] * n_streams
    errors: list = []

    def stream(i):
        try:
            time.sleep(delays[i])
            together[i] = sessions[i].generate_tokens(prompts[i], lengths[i])
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n_streams)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        llm.engine.speculative = True
        for s in sessions:
            s.close()
    assert not errors, errors
    parted = {i: next((k for k, (a, b) in enumerate(zip(solo[i], together[i])) if a != b), min(len(solo[i]),
                                                                                          len(together[i])))
              for i in range(n_streams) if solo[i] != together[i]}
    assert not parted, f"{arch}: streams parted from their solo tokens at {parted} (stream: token)"
    assert llm.engine.shared_steps > 0
