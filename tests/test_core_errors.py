"""Bad input raises a clear Python exception, and the process survives."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import elelem
from elelem import errors
from synthetic import TinyConfig, write_model


def test_missing_path(tmp_path):
    with pytest.raises(errors.ModelNotFoundError) as e:
        elelem.LLM(tmp_path / "nope.gguf")
    assert isinstance(e.value, FileNotFoundError) and "nope.gguf" in str(e.value)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "text.gguf"
    path.write_text("this is not a model\n" * 10)
    with pytest.raises(errors.GGUFError) as e:
        elelem.LLM(path)
    assert isinstance(e.value, ValueError) and "magic" in str(e.value).lower()


def test_truncated_file(tiny_model, tmp_path):
    path, _ = tiny_model(TinyConfig())
    cut = tmp_path / "cut.gguf"
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(errors.GGUFError):
        elelem.LLM(cut)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    import gguf
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(errors.UnsupportedArchitectureError) as e:
        elelem.LLM(path)
    for name in ("qwen2", "llama", "qwen3", "gemma3"):
        assert name in str(e.value)
    assert "mamba" in str(e.value)


def _rewrite_without(src_cfg: TinyConfig, tmp_path, drop=None, reshape=None):
    """Write the tiny model with one tensor dropped or replaced."""
    import gguf
    from synthetic import make_weights
    weights = make_weights(src_cfg)
    if drop:
        del weights[drop]
    if reshape:
        name, shape = reshape
        weights[name] = np.zeros(shape, np.float32)
    path = tmp_path / "broken.gguf"
    w = gguf.GGUFWriter(str(path), src_cfg.arch)
    w.add_context_length(src_cfg.n_ctx_train), w.add_embedding_length(src_cfg.n_embd)
    w.add_block_count(src_cfg.n_layer), w.add_feed_forward_length(src_cfg.n_ff)
    w.add_head_count(src_cfg.n_head), w.add_head_count_kv(src_cfg.n_head_kv)
    w.add_layer_norm_rms_eps(src_cfg.rms_eps)
    for name, arr in weights.items():
        w.add_tensor(name, arr)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def test_missing_tensor(tmp_path):
    path = _rewrite_without(TinyConfig(), tmp_path, drop="blk.1.ffn_up.weight")
    with pytest.raises(errors.ModelShapeError, match="blk.1.ffn_up.weight"):
        elelem.LLM(path)


def test_mis_shaped_tensor(tmp_path):
    path = _rewrite_without(TinyConfig(), tmp_path, reshape=("blk.0.attn_q.weight", (32, 64)))
    with pytest.raises(errors.ModelShapeError, match="blk.0.attn_q.weight"):
        elelem.LLM(path)


def test_n_head_not_dividing_n_embd(tmp_path):
    path = _rewrite_without(TinyConfig(n_head=5, n_head_kv=5), tmp_path)
    with pytest.raises(errors.ModelShapeError, match="does not divide"):
        elelem.LLM(path)


def test_n_head_kv_not_dividing_n_head(tmp_path):
    path = _rewrite_without(TinyConfig(n_head=4, n_head_kv=3), tmp_path)
    with pytest.raises(errors.ModelShapeError):
        elelem.LLM(path)


@pytest.fixture
def llm(tiny_model):
    path, _ = tiny_model(TinyConfig())
    with elelem.LLM(path, n_ctx=32) as llm:
        yield llm


def test_context_overflow_names_both_numbers(llm):
    llm.eval(list(range(20)))
    with pytest.raises(errors.ContextLimitError) as e:
        llm.eval(list(range(13)))
    assert "20" in str(e.value) and "13" in str(e.value) and "32" in str(e.value)
    assert llm.n_past == 20  # nothing was evaluated
    llm.eval(list(range(12)))  # exactly up to n_ctx is fine
    assert llm.n_past == 32


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_ctx=st.integers(1, 40), first=st.integers(1, 40))
def test_context_limit_is_exact(tiny_model, n_ctx, first):
    path, _ = tiny_model(TinyConfig())
    with elelem.LLM(path, n_ctx=n_ctx) as llm:
        if first > n_ctx:
            with pytest.raises(errors.ContextLimitError):
                llm.eval([1] * first)
            return
        llm.eval([1] * first)
        room = n_ctx - first
        with pytest.raises(errors.ContextLimitError):
            llm.eval([1] * (room + 1))
        if room:
            llm.eval([1] * room)
        assert llm.n_past == n_ctx


@pytest.mark.parametrize("bad", [-1, 96, 2**31 - 1, 2**40])
def test_token_id_out_of_range(llm, bad):
    with pytest.raises(errors.InvalidTokenError, match=str(bad)):
        llm.eval([1, bad])
    with pytest.raises(errors.InvalidTokenError):
        llm.generate_tokens([1, bad], 4)
    with pytest.raises(errors.InvalidTokenError):
        llm.generate_tokens([1], 4, stop_ids=[bad])
    assert llm.n_past == 0


@pytest.mark.parametrize("tokens", [[[1, 2], [3, 4]], 5, np.array(7)], ids=["2-D", "int", "0-d array"])
def test_eval_takes_only_a_flat_sequence(llm, tokens):
    with pytest.raises(errors.InvalidTokenError, match="flat"):
        llm.eval(tokens)
    assert llm.n_past == 0


@pytest.mark.parametrize("tokens", [[1.5, 2.0], np.array([1.0]), [2**70]], ids=["floats", "float array", "huge"])
def test_eval_never_truncates_or_wraps_ids(llm, tokens):
    with pytest.raises(errors.InvalidTokenError, match="integers"):
        llm.eval(tokens)
    assert llm.n_past == 0


def test_eval_accepts_strided_integer_arrays(llm):
    want = llm.eval([0, 2, 4]).copy()
    llm.reset()
    np.testing.assert_array_equal(llm.eval(np.arange(6, dtype=np.uint16)[::2]), want)


@pytest.mark.parametrize("length", [-1, 2**70, 1.0, True])
def test_rewind_checks_its_length(llm, length):
    llm.eval([1, 2, 3])
    with pytest.raises(errors.InvalidArgumentError):
        llm.rewind(length)
    assert llm.n_past == 3


def test_empty_prompt(llm):
    with pytest.raises(errors.InvalidArgumentError):
        llm.eval([])
    with pytest.raises(ValueError):
        llm.generate_tokens([], 4)


def test_negative_max_tokens(llm):
    with pytest.raises(errors.InvalidArgumentError):
        llm.generate_tokens([1, 2], -1)
    assert llm.generate_tokens([1, 2], 0) == []


BAD_OPTIONS = [
    {"n_ctx": 0}, {"n_batch": 0}, {"n_threads": 0}, {"kv_type": "q4"},
    # Past the C types: these were OverflowErrors from Cython's int conversion.
    {"n_ctx": 2**40}, {"n_batch": 2**64}, {"n_ctx": 2**31},
    # ggml's CPU threadpool has 512 slots; 100000 threads segfaulted in the first step.
    {"n_threads": 513}, {"n_threads": 100_000},
    {"n_ctx": 1.5}, {"n_threads": "2"}, {"n_batch": True},
]


@pytest.mark.parametrize("kwargs", BAD_OPTIONS, ids=[repr(o) for o in BAD_OPTIONS])
def test_bad_constructor_arguments(tiny_model, kwargs):
    path, _ = tiny_model(TinyConfig())
    with pytest.raises(errors.InvalidArgumentError, match=next(iter(kwargs))):
        elelem.LLM(path, **kwargs)


def test_session_options_accept_numpy_integers_and_check_thread_changes(tiny_model):
    path, _ = tiny_model(TinyConfig())
    with elelem.LLM(path, n_ctx=np.int64(32), n_threads=np.int32(1)) as llm:
        assert llm.n_ctx == 32
        native = llm.engine.context
        with pytest.raises(errors.InvalidArgumentError):
            native.set_n_threads(100_000)
        native.set_n_threads(2)
        assert native.n_threads == 2 and llm.eval([1, 2]).shape[-1] == llm.n_vocab


def test_a_context_past_the_trained_length_is_allowed_with_a_warning(tiny_model, caplog):
    path, config = tiny_model(TinyConfig(n_ctx_train=64))
    with caplog.at_level("WARNING", logger="elelem"), elelem.LLM(path, n_ctx=128) as llm:
        assert llm.n_ctx == 128
    assert any("trained context of 64" in r.getMessage() for r in caplog.records)


def test_use_after_close(tiny_model):
    path, _ = tiny_model(TinyConfig())
    llm = elelem.LLM(path)
    llm.close()
    with pytest.raises(errors.ClosedError):
        llm.eval([1])
    llm.close()  # closing twice is fine


def test_native_objects_have_one_construction_path():
    with pytest.raises(TypeError):
        elelem._core.Model()
    with pytest.raises(TypeError):
        elelem._core.Context()
    with pytest.raises(TypeError):
        elelem._core.KVCache()


def test_session_keeps_its_model_alive(tiny_model):
    path, _ = tiny_model(TinyConfig())
    llm = elelem.LLM(path)
    context = elelem._core.new_context(llm._model, 16)
    want = context.decode([1, 2, 3], 0).copy()
    del llm  # the user's last reference to the model goes away
    gc.collect()
    context.cache.seq_rm(0, 0)
    np.testing.assert_array_equal(context.decode([1, 2, 3], 0), want)


def test_closed_model_refuses_new_sessions(tiny_model):
    path, _ = tiny_model(TinyConfig())
    llm = elelem.LLM(path)
    model = llm._model
    llm.close()
    with pytest.raises(errors.ClosedError):
        elelem._core.new_context(model, 16)


def test_all_errors_share_one_base():
    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == errors.__name__:
            assert issubclass(obj, errors.ElelemError)
