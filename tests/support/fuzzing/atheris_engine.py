"""Coverage-guided fuzzing with atheris (libFuzzer), the alternative to the seeded mutator.

    python -m fuzzing.atheris_engine TARGET WORKDIR [libFuzzer flags...]

Normally started by ``scripts/fuzz.py --engine atheris``.  elelem and jinja2
are instrumented, so libFuzzer keeps the inputs that reach new Python code
(the compiled core is not instrumented; crashes in it are still caught).  The
corpus lives in ``WORKDIR/corpus`` and starts from the same seeds as the
mutator: the synthetic GGUF models, sample texts, the real chat templates and
the known payloads.

Every input is first written, as the case file the runner would get, to
``WORKDIR/current-case``; then the target's own ``execute`` runs in this
process.  A failing outcome is raised as an exception (libFuzzer then stops and
saves the input); a native crash stops libFuzzer the same way.  Either way
``current-case`` is the culprit, which ``scripts/fuzz.py`` replays in a runner
and saves as a fixture.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import atheris


def seed_corpus(target: str, work: Path, corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    if any(corpus.iterdir()):
        return
    if target == "gguf":
        from .seeds import write_synthetic_seeds
        for path in write_synthetic_seeds(work / "seeds"):
            (corpus / path.name).write_bytes(path.read_bytes())
    elif target == "tokenizer":
        from .tokenizer_target import _PROSE, _BAD_UTF8
        for i, text in enumerate([_PROSE.encode()] + list(_BAD_UTF8) + ["<|im_start|>user\n".encode()]):
            (corpus / f"text-{i}").write_bytes(bytes([i]) + text)
    else:
        from .template_target import _PAYLOADS, _real_templates
        for i, source in enumerate(_real_templates() + list(_PAYLOADS)):
            (corpus / f"template-{i}").write_bytes(source.encode("utf-8", "surrogatepass"))


def case_from_data(target: str, data: bytes, vocabs: list[str]) -> bytes:
    """The runner's case file for one libFuzzer input."""
    if target == "gguf":
        return data
    if target == "tokenizer":
        vocab = vocabs[data[0] % len(vocabs)] if data else vocabs[0]
        special = bool(data[:1]) and data[0] & 0x80 != 0
        import base64
        return json.dumps({"vocab": vocab, "special": special, "bytes_b64": base64.b64encode(data[1:]).decode(),
                           "ids": list(data[1:9])}).encode()
    return json.dumps({"source": data.decode("utf-8", "replace"),
                       "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}],
                       "timeout_s": 0.3}).encode()


def main(argv: list[str]) -> None:
    target, work = argv[1], Path(argv[2])
    work.mkdir(parents=True, exist_ok=True)
    with atheris.instrument_imports(include=["elelem", "jinja2"]):
        import elelem.text.chat_template  # noqa: F401
        import elelem.gguf.reader  # noqa: F401
        import elelem.text.tokenizer  # noqa: F401
        from . import gguf_target, template_target, tokenizer_target
    module = {"gguf": gguf_target, "tokenizer": tokenizer_target, "template": template_target}[target]
    if hasattr(module, "warm_up"):
        module.warm_up()
    vocabs = tokenizer_target.available_vocabs()
    corpus = work / "corpus"
    seed_corpus(target, work, corpus)
    current = work / "current-case"

    def one_input(data: bytes) -> None:
        current.write_bytes(case_from_data(target, data, vocabs))
        outcome = module.execute(current)
        if outcome.failed:
            raise RuntimeError(f"{outcome.status} in {outcome.stage}: {outcome.error}\n{outcome.detail}")

    flags = list(argv[3:])
    if target == "gguf" and not any(f.startswith("-max_len=") for f in flags):
        flags.append("-max_len=262144")  # the synthetic seeds are up to ~160 KB
    atheris.Setup([argv[0]] + flags + [str(corpus)], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
