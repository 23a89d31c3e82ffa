"""The README's and docs/api.md's runnable examples run, on SmolLM2-135M.

A Python block is runnable when the line before its fence is an HTML comment,
which neither GitHub nor mkdocs shows:

    <!-- runnable -->
    ```python
    ...
    ```

``<!-- runnable: server -->`` marks a block that talks to ``elelem serve`` at
``http://127.0.0.1:8080``: it runs against a server started here, in-process,
on a free loopback port.

Each block runs as written, in a fresh namespace, with one change: the model.
Every packaged model name becomes ``smollm2-135m`` and ``LLM()`` (the default
model) becomes ``LLM("smollm2-135m")``, so the test pulls one small model; for
server blocks the URL becomes the test server's.  Keep runnable examples short
(a small ``max_tokens``): the whole file takes seconds.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/api.md")
MODEL = "smollm2-135m"
# The packaged models' names (elelem.model.hub.KNOWN_MODELS), written here so that collecting
# this file needs no import of elelem.
OTHER_MODELS = ("qwen2.5-coder-0.5b", "gemma3-270m")
DOC_SERVER_URL = "http://127.0.0.1:8080"

MARKER = re.compile(r"^<!--\s*runnable(?::\s*(?P<kind>[a-z]+))?\s*-->$")
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Example:
    document: str
    line: int            # 1-based line of the opening fence
    code: str
    server: bool

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


def runnable_examples(document: str) -> list[Example]:
    """The blocks of ``document`` marked runnable; a marker not followed by a
    Python fence, or a fence left open, is an error (a typo must not hide a block)."""
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    examples = []
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i].strip())
        if marker is None:
            i += 1
            continue
        kind = marker.group("kind")
        if kind not in (None, "server"):
            raise ValueError(f"{document}:{i + 1}: unknown runnable marker {lines[i]!r}")
        opening = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if opening is None or opening.group("info").strip().split()[:1] != ["python"]:
            raise ValueError(f"{document}:{i + 1}: a runnable marker must stand on the line before a ```python fence")
        fence = opening.group("fence")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"{document}:{i + 2}: the runnable block's fence is never closed")
        examples.append(Example(document, i + 2, "\n".join(lines[i + 2:end]) + "\n", kind == "server"))
        i = end + 1
    return examples


def for_smollm(example: Example, server_url: str | None = None) -> str:
    """The example's code with SmolLM2 as its model (and the test server's URL)."""
    code = example.code
    for name in OTHER_MODELS:
        code = code.replace(f'"{name}"', f'"{MODEL}"').replace(f"'{name}'", f"'{MODEL}'")
    code = code.replace("LLM()", f'LLM("{MODEL}")')
    if server_url is not None:
        code = code.replace(DOC_SERVER_URL, server_url)
    return code


EXAMPLES = [example for document in DOCUMENTS for example in runnable_examples(document)]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_document_has_runnable_examples(document):
    assert runnable_examples(document), f"{document} marks no block runnable (<!-- runnable --> before ```python)"


def test_examples_name_only_the_model_the_test_swaps():
    for example in EXAMPLES:
        code = for_smollm(example, "http://test")
        assert not any(f'"{name}"' in code or f"'{name}'" in code for name in OTHER_MODELS), example.name
        assert "LLM()" not in code and "Llama(" not in code, example.name
        assert ".gguf" not in code, f"{example.name}: a runnable example must name a packaged model, not a file"
        if example.server:
            assert DOC_SERVER_URL not in code and "http://test" in code, example.name


class InProcessServer:
    """``elelem serve`` in a thread, on a free loopback port (as tests/test_server.py runs it)."""

    def __init__(self):
        import uvicorn
        from elelem.server import ServerConfig, create_app
        self.app = create_app(ServerConfig(models=[MODEL], n_ctx=512, n_threads=1, parallel=2, keep_alive=None))
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_config=None,
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def doc_server(smollm_path):
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    server = InProcessServer()
    yield server
    server.stop()


@pytest.mark.real_model
@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_example_runs(example, smollm_path, request):
    url = request.getfixturevalue("doc_server").url if example.server else None
    code = for_smollm(example, url)
    namespace = {"__name__": "__doc_example__"}
    logging_state = _logging_state()  # an example may configure logging: the other tests must not see it
    try:
        exec(compile(code, str(ROOT / example.document) + f" (block at line {example.line})", "exec"), namespace)
    finally:
        from elelem import LLM
        for value in namespace.values():  # an example that leaves a model open: free it now
            if isinstance(value, LLM):
                value.close()
        _restore_logging(logging_state)


def _logging_state():
    loggers = [logging.root] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                if isinstance(logger, logging.Logger)]
    return logging.root.handlers[:], {logger: logger.level for logger in loggers}


def _restore_logging(state) -> None:
    handlers, levels = state
    for handler in logging.root.handlers[:]:
        if handler not in handlers:
            logging.root.removeHandler(handler)
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(logger, logging.NOTSET))
    logging.root.setLevel(levels[logging.root])
