"""llama.cpp's renderings of chat templates, made live by its own code, or read from a stored fixture.

llama.cpp renders chat templates with its C++ Jinja engine (common/jinja/)
behind its chat-format code (common/chat.cpp), neither of which
llama-cpp-python exposes.  scripts/reference_chat_templates.py builds them,
from the pinned sdist, into a small command (scripts/chat_template_driver.cpp);
:func:`run` sends it requests.  Rendering is not machine-dependent the way
ggml's kernels are, so without a build the stored
``tests/support/fixtures/chat_templates_llamacpp_engine.json`` stands in, when it was
made from the same templates and conversations; otherwise the test skips (and
fails under CI=true).  That fixture is made by this file::

    python scripts/reference_llamacpp.py && python scripts/reference_chat_templates.py
    python tests/support/llamacpp_templates.py     # writes tests/support/fixtures/chat_templates_llamacpp_engine.json
"""
from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import template_corpus_cases as cases  # noqa: E402

STORED = ROOT / "tests" / "support" / "fixtures" / "chat_templates_llamacpp_engine.json"
# What a stored rendering keeps of the driver's result: the prompt as its sha256 and length,
# the variables it was rendered from (the tool list, when it is template_corpus_cases.TOOLS,
# as this marker), llama.cpp's handler and format, or its error.
STORED_KEYS = ("context", "handler", "format", "error")
TOOLS_MARKER = "<template_corpus_cases.TOOLS>"


@functools.cache
def builder():
    """scripts/reference_chat_templates.py, imported (standard library only)."""
    spec = importlib.util.spec_from_file_location("reference_chat_templates",
                                                  ROOT / "scripts" / "reference_chat_templates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def driver() -> Path | None:
    """The built driver for this machine, or None."""
    return builder().driver_path()


def not_built() -> str:
    return ("llama.cpp's chat templating is not built for this machine (python scripts/reference_llamacpp.py, "
            f"then python scripts/reference_chat_templates.py, builds it into {builder().driver_dir()})")


def run(requests: list[dict], now: int | None = cases.FIXED_NOW_EPOCH) -> list[dict] | None:
    """The driver's results for ``requests`` (see scripts/chat_template_driver.cpp), or None without a build."""
    exe = driver()
    if exe is None:
        return None
    doc = {"requests": requests} if now is None else {"now": now, "requests": requests}
    done = subprocess.run([str(exe)], input=json.dumps(doc, ensure_ascii=False), capture_output=True,
                          encoding="utf-8", timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{exe} failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return json.loads(done.stdout)["results"]


def render(template: str, context: dict) -> dict | None:
    """llama.cpp's Jinja engine alone: ``template`` with the variables of ``context``."""
    results = run([{"mode": "render", "template": template, "context": context}])
    return None if results is None else results[0]


def request(source: str, conversation: str) -> dict:
    """The driver's "apply" request for one template and one conversation of template_corpus_cases."""
    return {"mode": "apply", "template": source, "bos_token": cases.BOS, "eos_token": cases.EOS,
            **cases.CONVERSATIONS[conversation]}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def corpus(templates_dir: Path) -> dict | None:
    """Every template of ``templates_dir`` with each conversation, through llama.cpp, or None without a build:
    {template file name: {"sha256", "patched_template" (if llama.cpp patched it), "renders":
    {conversation: the driver's result, with "prompt_sha256" and "chars" added}}}."""
    names = sorted(p.name for p in templates_dir.glob("*.jinja"))
    sources = {name: (templates_dir / name).read_text(encoding="utf-8") for name in names}
    pairs = [(name, conversation) for name in names for conversation in cases.CONVERSATIONS]
    results = run([request(sources[name], conversation) for name, conversation in pairs])
    if results is None:
        return None
    out = {name: {"sha256": sha256(sources[name]), "renders": {}} for name in names}
    for (name, conversation), result in zip(pairs, results):
        if "patched_template" in result:
            out[name]["patched_template"] = result.pop("patched_template")
        if "prompt" in result:
            result.update(prompt_sha256=sha256(result["prompt"]), chars=len(result["prompt"]))
        out[name]["renders"][conversation] = result
    return out


def compact(templates: dict) -> dict:
    """``corpus()``'s result as the stored fixture keeps it."""
    out = {}
    for name, entry in templates.items():
        stored_entry = {k: v for k, v in entry.items() if k != "renders"}
        stored_entry["renders"] = renders = {}
        for conversation, result in entry["renders"].items():
            kept = {k: result[k] for k in (*STORED_KEYS, "prompt_sha256", "chars") if k in result}
            context = kept.get("context")
            if isinstance(context, dict) and context.get("tools") == cases.TOOLS:
                kept["context"] = {**context, "tools": TOOLS_MARKER}
            renders[conversation] = kept
        out[name] = stored_entry
    return out


def expand(templates: dict) -> dict:
    """The stored fixture's renderings in ``corpus()``'s shape (without the prompts' text)."""
    for entry in templates.values():
        for result in entry["renders"].values():
            context = result.get("context")
            if isinstance(context, dict) and context.get("tools") == TOOLS_MARKER:
                context["tools"] = cases.TOOLS
    return templates


def stored() -> tuple[dict | None, str]:
    """The stored fixture's renderings, if made from these conversations, else (None, why not)."""
    if not STORED.is_file():
        return None, f"{STORED.name} is missing"
    doc = json.loads(STORED.read_text(encoding="utf-8"))
    if doc["header"].get("cases_digest") != cases.digest():
        return None, f"{STORED.name} was made from other conversations (tests/support/template_corpus_cases.py changed)"
    return expand(doc["templates"]), ""


def main() -> int:
    import llamacpp_sdist

    ap = argparse.ArgumentParser(description="write the stored fixture of llama.cpp's corpus renderings")
    ap.add_argument("--out", type=Path, default=STORED)
    args = ap.parse_args()
    templates = corpus(llamacpp_sdist.templates_dir())
    if templates is None:
        print(not_built(), file=sys.stderr)
        return 1
    templates = compact(templates)
    record = json.loads((driver().parent / "build.json").read_text())
    header = {
        "made_by": "python tests/support/llamacpp_templates.py (scripts/chat_template_driver.cpp, mode apply; "
                   "prompts as sha256 and length)",
        "llama_cpp_python": record["llama_cpp_python"], "sdist_sha256": record["sdist_sha256"],
        "driver_sha256": record["driver_sha256"], "cxx": record["cxx"],
        "templates_from": "models/templates/*.jinja of the sdist",
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "cases_digest": cases.digest(),
    }
    # Not sort_keys: the variables' key order is what tojson writes.
    args.out.write_text(json.dumps({"header": header, "templates": templates}, ensure_ascii=False, indent=0) + "\n",
                        encoding="utf-8")
    n = sum(len(t["renders"]) for t in templates.values())
    failed = sum("error" in r for t in templates.values() for r in t["renders"].values())
    print(f"wrote {args.out}: {len(templates)} templates, {n} renderings, {failed} refused by llama.cpp")
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
