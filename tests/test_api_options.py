"""LLM's options in their groups (elelem.api.options): one declaration, built the same
way from keywords, the command line, the server's config and compat.Llama."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

import elelem
from elelem.api import options
from elelem.api.options import (CacheOptions, ContextOptions, PlacementOptions, SpeculativeOptions, WeightOptions,
                                build_options, override_options)
from elelem.errors import InvalidArgumentError


def test_every_group_field_is_an_llm_keyword_with_the_same_default():
    from elelem.api.llm import LLM
    parameters = inspect.signature(LLM).parameters
    for group, cls in options.GROUPS.items():
        assert parameters[group].default is None and parameters[group].kind is inspect.Parameter.KEYWORD_ONLY
        for field in dataclasses.fields(cls):
            assert parameters[field.name].kind is inspect.Parameter.KEYWORD_ONLY, field.name
            assert parameters[field.name].default == field.default, field.name
    grouped = set(options.FIELD_GROUP) | set(options.GROUPS)
    assert set(parameters) - grouped == {"model_path", "progress", "embedding", "pooling", "tool_call_format"}


def test_the_rpc_timeout_default_is_the_cores():
    from elelem import _core
    assert options.DEFAULT_RPC_TIMEOUT == _core.DEFAULT_RPC_TIMEOUT


def test_the_groups_are_exported_and_frozen():
    assert elelem.ContextOptions is ContextOptions and elelem.CacheOptions is CacheOptions
    with pytest.raises(dataclasses.FrozenInstanceError):
        ContextOptions().n_ctx = 5


def test_keywords_build_the_groups_and_others_pass_through():
    built = build_options({"n_ctx": 512, "kv_type": "q8_0", "repack": False, "n_gpu_layers": 0,
                           "speculative": False, "state_cache_mb": 0, "tool_call_format": "hermes"})
    assert built["context"] == ContextOptions(n_ctx=512, kv_type="q8_0")
    assert built["weights"] == WeightOptions(repack=False)
    assert built["placement"] == PlacementOptions(n_gpu_layers=0)
    assert built["speculation"] == SpeculativeOptions(speculative=False)
    assert built["caches"] == CacheOptions(state_cache_mb=0) and built["caches"].state_cache_bytes == 0
    assert built["tool_call_format"] == "hermes"
    assert CacheOptions().state_cache_bytes == 2048 << 20


def test_a_group_and_one_of_its_fields_at_once_is_a_type_error():
    context = ContextOptions(n_ctx=8192)
    assert build_options({"context": context, "n_ctx": None, "n_batch": 512})["context"] is context  # defaults
    with pytest.raises(TypeError, match="n_ctx given both as a keyword and in context=ContextOptions"):
        build_options({"context": context, "n_ctx": 4096})
    with pytest.raises(TypeError, match="placement must be a PlacementOptions, got dict"):
        build_options({"placement": {"n_gpu_layers": 0}})


def test_options_are_checked_where_they_are_declared():
    for make, message in [(lambda: ContextOptions(n_ctx=0), "n_ctx must be between 1 and 2,147,483,647, got 0"),
                          (lambda: ContextOptions(n_ctx=1.5), "n_ctx must be an integer, got 1.5"),
                          (lambda: ContextOptions(flash_attn="yes"), "flash_attn must be True, False or 'auto'"),
                          (lambda: CacheOptions(state_cache_mb=-1), "state_cache_mb must be a non-negative"),
                          (lambda: PlacementOptions(rpc_servers="h:1", rpc_timeout=0), "rpc_timeout must be")]:
        with pytest.raises(InvalidArgumentError, match=message):
            make()
    assert PlacementOptions(rpc_timeout=0).rpc_timeout == 0  # no server: the timeout is not used


def test_override_replaces_fields_and_groups():
    base = build_options({"n_ctx": 512, "flash_attn": True})
    changed = override_options(base, {"flash_attn": False, "weights": WeightOptions(use_mmap=False),
                                      "tool_call_format": "glm"})
    assert changed["context"] == ContextOptions(n_ctx=512, flash_attn=False)
    assert changed["weights"] == WeightOptions(use_mmap=False) and changed["tool_call_format"] == "glm"
    assert base["context"].flash_attn is True


def test_the_servers_config_builds_the_groups():
    from elelem.server.config import ServerConfig
    config = ServerConfig(models=["m.gguf"], parallel=3, n_threads=2, main_gpu=1, prompt_cache="/tmp/c",
                          llm_options={"rpc_servers": "h:1", "n_batch": 64, "tool_call_format": "hermes"})
    built = config.model_options(300)
    assert built["context"] == ContextOptions(n_ctx=300, n_threads=2, n_batch=64, n_seq_max=4, kv_size=1024,
                                              flash_attn=True)
    assert built["placement"] == PlacementOptions(main_gpu=1, rpc_servers="h:1")
    assert built["caches"] == CacheOptions(prompt_cache="/tmp/c") and built["tool_call_format"] == "hermes"


def test_the_command_line_builds_the_groups():
    from elelem.cli.loading import llm_options
    from elelem.cli.parser import build_parser
    args = build_parser().parse_args(["run", "-m", "x.gguf", "-c", "512", "-t", "2", "--no-mmap", "-fa", "off",
                                      "--no-speculative", "--state-cache-mb", "0", "-ngl", "0", "hi"])
    built = llm_options(args)
    assert built["context"] == ContextOptions(n_ctx=512, n_threads=2, flash_attn=False)
    assert built["weights"] == WeightOptions(use_mmap=False)
    assert built["placement"] == PlacementOptions(n_gpu_layers=0)
    assert built["speculation"] == SpeculativeOptions(speculative=False)
    assert built["caches"] == CacheOptions(state_cache_mb=0)
    assert llm_options(args, n_ctx=64)["context"].n_ctx == 64


def test_llms_methods_are_its_own_with_the_sessions_signatures():
    from elelem.api.llm import LLM
    from elelem.api.session import Session
    for name in ("eval", "prefill", "rewind", "reset", "generate_tokens", "tokenize", "detokenize", "cancel",
                 "save_state", "load_state", "generate", "chat", "create_completion", "create_chat_completion",
                 "stream", "chat_stream"):
        assert name in LLM.__dict__, name
        assert inspect.signature(LLM.__dict__[name]) == inspect.signature(getattr(Session, name)), name
        assert inspect.getdoc(getattr(Session, name)) in LLM.__dict__[name].__doc__
    for name in ("n_past", "n_evaluated", "cached_tokens", "eos_ids"):
        assert isinstance(LLM.__dict__[name], property), name
    assert LLM.__call__ is LLM.create_completion


@pytest.mark.real_model
def test_a_group_opens_the_model_as_its_keywords_do_and_the_core_is_called_by_keyword(smollm_path, monkeypatch):
    import elelem.api.llm as llm_module
    calls = []
    for name in ("new_context", "open_model"):
        native = getattr(llm_module, name)

        def recorded(*args, _native=native, _name=name, **kwargs):
            calls.append((_name, args))
            return _native(*args, **kwargs)
        monkeypatch.setattr(llm_module, name, recorded)
    with elelem.LLM(smollm_path, n_ctx=64, n_threads=1, kv_type="q8_0", state_cache_mb=0) as flat:
        expected = flat.generate("Once upon a time", max_tokens=6, temperature=0)
        cells = flat.engine.context.kv_size
    with elelem.LLM(smollm_path, context=ContextOptions(n_ctx=64, n_threads=1, kv_type="q8_0"),
                    caches=CacheOptions(state_cache_mb=0)) as grouped:
        assert grouped.generate("Once upon a time", max_tokens=6, temperature=0) == expected
        assert (grouped.n_ctx, grouped.engine.context.kv_size) == (64, cells)
    assert calls and all(args == () for _, args in calls)
