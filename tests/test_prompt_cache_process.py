"""The prompt cache across processes, on SmolLM2: a fresh process under a
long system prompt loads it from the folder a previous process filled, and
answers exactly as a process that evaluated everything.  (The time to first
token is measured by benchmarks/prompt_cache.py, not asserted here.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model

SYSTEM = "You are a coding agent. " + " ".join(
    f"Rule {i}: keep change {i} small, test it, and explain why it is needed." for i in range(40))
WORKER = """
import json, sys
import elelem
model, folder, question = sys.argv[1:4]
llm = elelem.LLM(model, n_ctx=2048, n_threads=2, prompt_cache=folder or None)
text = llm.chat([{"role": "system", "content": %r}, {"role": "user", "content": question}],
                max_tokens=16, temperature=0.0)
cache = llm.engine.prompt_cache
print(json.dumps({"text": text, "loaded": cache.loaded_tokens if cache else 0,
                  "evaluated": llm.engine.context.n_evaluated}))
llm.close()
""" % SYSTEM


def ask(model, folder, question):
    out = subprocess.run([sys.executable, "-c", WORKER, str(model), str(folder), question],
                         capture_output=True, text=True, cwd=Path(__file__).parent, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_loads_the_system_prompt_and_answers_the_same(smollm_path, tmp_path):
    cold = ask(smollm_path, "", "Rename x to y in: x = 1")
    first = ask(smollm_path, tmp_path, "What does rule 3 say?")
    assert first["loaded"] == 0 and list(tmp_path.rglob("*.kvc"))
    warm = ask(smollm_path, tmp_path, "Rename x to y in: x = 1")
    assert warm["text"] == cold["text"]
    assert warm["loaded"] > 400                       # the system prompt, loaded ...
    assert warm["evaluated"] < cold["evaluated"] - 400  # ... instead of evaluated
