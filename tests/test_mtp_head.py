"""Multi-token-prediction heads (elelem.model.mtp): the head as a model of
its own over the file's NextN block, its logits and hidden states bit for
bit those of llama.cpp's MTP context run live on the same synthetic file
(flash attention off and on), and files whose block is broken refused.
Drafting with the head: tests/test_mtp.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import elelem
from elelem.gguf.reader import read_gguf
from elelem.model.architectures import model_spec
from elelem._core import new_context, open_model
from elelem.model.mtp import has_mtp, mtp_matmul_weights, mtp_spec
from llamacpp_reference import Reference, elelem_kernel_options, run_script, skip_or_fail
from synthetic import TinyConfig, write_model
from synthetic_mla import MLAConfig
from vocab_metadata import vocab_writer

# Qwen3.5 with one MTP block (the converter's layout), with SmolLM2's vocabulary so that llama.cpp loads it.
QWEN35 = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=11, mtp=True,
                    n_vocab=49152)
QWEN35MOE = TinyConfig(arch="qwen35moe", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=12, mtp=True,
                       n_vocab=49152)
# GLM-4.5's layout: a dense first layer, then experts; its NextN block has experts too, and no
# shared_head_norm of its own (the model's output norm serves).
GLM4MOE = TinyConfig(arch="glm4moe", head_dim=32, n_rot=16, n_layer=3, seed=13, n_vocab=49152)
# GLM-4.7-Flash's layout (deepseek2, multi-head latent attention), its NextN block as Glm4MoeLiteModel writes it.
DEEPSEEK2 = MLAConfig(n_layer=3, n_nextn=1, gating=None, n_vocab=49152, seed=14)
# Qwen3-Next: Qwen3.5's MTP block with plain NeoX RoPE and value heads grouped by key head.
QWEN3NEXT = TinyConfig(arch="qwen3next", head_dim=32, n_rot=8, n_layer=4, wtype="q8_0", seed=15, mtp=True,
                       n_vocab=49152)
CONFIGS = {"qwen35": QWEN35, "qwen35moe": QWEN35MOE, "glm4moe": GLM4MOE, "deepseek2": DEEPSEEK2,
           "qwen3next": QWEN3NEXT}
PROMPT = [1, 5, 9, 20, 33, 7, 2, 11, 300, 4000, 17, 23]
CHAIN = 3        # draft steps after the prompt, each from the head's own hidden state


@pytest.fixture(scope="module")
def mtp_models(smollm_path, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("mtp")
    paths = {}
    for name, cfg in CONFIGS.items():
        paths[name] = folder / f"{name}-mtp.gguf"
        write_model(paths[name], cfg, extra_metadata=vocab_writer(smollm_path))
    return paths


def _head_context(llm):
    """The MTP head of ``llm``'s file, opened natively beside it with the same
    context options (what elelem.api.draft.open_mtp does)."""
    spec = mtp_spec(llm.spec, llm.gguf)
    model = open_model(path=llm.path, builder=llm.spec.arch.mtp_builder, hparams=spec.hparams,
                       global_tensors=spec.global_tensors, layer_tensors=spec.layer_tensors,
                       matmul_weights=mtp_matmul_weights(spec), amx_types=[])
    ctx = llm.engine.context
    return new_context(model=model, kv_size=ctx.kv_size, n_batch=ctx.n_batch, n_threads=ctx.n_threads,
                       kv_type=ctx.cache.type_k, type_v=ctx.cache.type_v, flash_attn=ctx.flash_attn)


def _reference(path: Path, flash: bool) -> dict:
    args = ["--model", str(path), "--tokens", ",".join(map(str, PROMPT)), "--chain", str(CHAIN),
            "--out", "{out}/mtp.json"] + (["--flash-attn"] if flash else [])
    live = run_script("make_mtp_reference.py", args, [str(flash), str(PROMPT), str(CHAIN)], [path], ["mtp.json"])
    if live is None:
        skip_or_fail(Reference.not_built())
    return live["mtp.json"]


def _f32(rows) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def test_the_spec_of_the_head_is_one_attention_layer_of_the_block(mtp_models):
    gguf = read_gguf(mtp_models["qwen35"])
    spec = model_spec(gguf)
    assert has_mtp(spec) and spec.hparams["n_layer"] == 4 and spec.hparams["n_layer_nextn"] == 1
    head = mtp_spec(spec, gguf)
    assert head.hparams["n_layer"] == 1 and head.hparams["recurrent_layers"] == [False] and head.hparams["mtp_head"]
    assert head.layer_tensors[0]["nextn_eh_proj"] == "blk.4.nextn.eh_proj.weight"
    assert head.layer_tensors[0]["wq"] == "blk.4.attn_q.weight"
    assert "nextn_shared_head_head" not in head.layer_tensors[0]   # the model's output, as the converter writes


def test_a_block_missing_its_projection_is_refused(smollm_path, tmp_path):
    path = tmp_path / "broken.gguf"
    write_model(path, TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, mtp=True, seed=3,
                                 drop=("blk.4.nextn.eh_proj.weight",)))
    gguf = read_gguf(path)
    with pytest.raises(elelem.errors.ModelShapeError, match="eh_proj"):
        mtp_spec(model_spec(gguf), gguf)


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_head_logits_match_llamacpp_exactly(mtp_models, name, flash):
    """The target's every-row hidden states (llama.cpp's h_nextn, unmasked),
    then the head on the prompt paired with them and CHAIN draft steps paired
    with its own: logits and hidden states bit for bit llama.cpp's."""
    ref = _reference(mtp_models[name], flash)
    options = dict(elelem_kernel_options(), flash_attn=flash)
    with elelem.LLM(mtp_models[name], n_threads=2, kv_size=256, speculative=False, **options) as llm:
        ctx, head = llm.engine.context, _head_context(llm)
        logits = ctx.decode(PROMPT, 0, True, keep_hidden=True)
        hidden = ctx.last_hidden
        np.testing.assert_array_equal(logits, _f32(ref["logits"]))
        np.testing.assert_array_equal(hidden, _f32(ref["hidden"]))
        pairs = np.concatenate([np.zeros((1, hidden.shape[1]), np.float32), hidden[:-1]])
        rows = [head.decode(PROMPT, 0, True, hidden_in=pairs, keep_hidden=True)]
        states = [head.last_hidden]
        for token in ref["chain_tokens"]:
            assert token == int(np.argmax(rows[-1][-1]))
            rows.append(head.decode([token], 0, True, hidden_in=states[-1][-1:], keep_hidden=True,
                                    decode_kernels=True))
            states.append(head.last_hidden)
        np.testing.assert_array_equal(np.concatenate(rows), _f32(ref["mtp_logits"]))
        np.testing.assert_array_equal(np.concatenate(states), _f32(ref["mtp_hidden"]))


def test_a_head_step_without_hidden_states_is_refused(mtp_models):
    with elelem.LLM(mtp_models["qwen35"], n_threads=2, kv_size=256, amx=False, speculative=False) as llm:
        head = _head_context(llm)
        with pytest.raises(elelem.errors.InvalidArgumentError, match="hidden"):
            head.decode([1, 2], 0)
        with pytest.raises(elelem.errors.InvalidArgumentError, match="hidden_in must be"):
            head.decode([1, 2], 0, hidden_in=np.zeros((3, QWEN35.n_embd), np.float32))
        with pytest.raises(elelem.errors.InvalidArgumentError, match="only an MTP head"):
            llm.engine.context.decode([1, 2], 0, hidden_in=np.zeros((2, QWEN35.n_embd), np.float32))
