"""The library prints nothing; what it has to say goes to the "elelem" logger (ggml's to "elelem.ggml")."""
from __future__ import annotations

import logging

import pytest

import elelem

pytestmark = pytest.mark.real_model


def test_the_library_prints_nothing_and_logs_to_elelem(smollm_path, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="elelem")
    with elelem.LLM(smollm_path, n_ctx=256, n_threads=1) as llm:
        llm.generate("Hello", max_tokens=3, temperature=0)
        list(llm.chat_stream([{"role": "user", "content": "Hi"}], max_tokens=3))
        llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=2, stream=False)
        session = llm.new_session()
        session.generate("Hi", max_tokens=2)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    names = {record.name for record in caplog.records}
    assert names and all(name == "elelem" or name.startswith("elelem.") for name in names)
    assert any("loaded" in record.getMessage() for record in caplog.records)


def test_ggml_messages_go_to_the_elelem_ggml_logger(qwen_path, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="elelem")
    with elelem.LLM(qwen_path, n_ctx=64, n_threads=1):
        pass  # loading repacks Q4_K weights, which ggml reports
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert any(record.name == "elelem.ggml" for record in caplog.records)
