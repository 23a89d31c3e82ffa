"""The GGUF target: mutated model files through every stage that reads them.

Runner side, :func:`execute` takes one file through what a user's program
does with it:

1. ``read_gguf`` (the validator);
2. ``elelem.LLM(path, n_ctx=64)``, then two tokens evaluated (the first and the
   last id of the vocabulary), so ggml parses the file, maps the weights and
   builds and runs a graph;
3. ``validate_tokenizer_metadata``, then ``Tokenizer.from_metadata`` and a
   round trip of a short text with special tokens;
4. ``ChatTemplate.from_metadata`` and one render.

Each stage may refuse the file with an ``ElelemError`` (elelem's own types,
:mod:`elelem.errors`), and only with one: a bare ``ValueError`` or
``MemoryError`` means the input reached code that did not check it (an
allocation sized from an unchecked count fails under the runner's memory cap,
see :mod:`fuzzing.runner`).  Stages 2 and 3 both run when the reader accepts
the file (a bad model can have a good tokenizer and the other way round).

Parent side, :class:`GGUFCases` writes case files from the seeds with the
seeded :class:`~fuzzing.gguf_mutator.Mutator`.
"""
from __future__ import annotations

import base64
import zlib
from pathlib import Path
from typing import Optional

from .outcomes import PASS, UNEXPECTED, Outcome, from_exception

N_CTX = 64
SAMPLE_TEXT = "Hello, world! <|im_start|>user\n\u00e9\u4e2d\U0001F600 <0x0A> <s></s>\t  end"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def allowed_errors() -> tuple[type, ...]:
    from elelem.errors import ElelemError
    return (ElelemError,)


def execute(path: Path) -> Outcome:
    import elelem
    from elelem.text.chat_template import ChatTemplate
    from elelem.gguf.reader import read_gguf, validate_tokenizer_metadata
    from elelem.text.tokenizer import Tokenizer

    allowed = allowed_errors()
    stages: dict[str, str] = {}
    try:
        gguf = read_gguf(path)
    except Exception as error:  # noqa: BLE001 -- classified, not swallowed
        outcome = from_exception(error, "read", allowed)
        outcome.stages = {"read": outcome.status}
        return outcome
    stages["read"] = PASS
    worst: Optional[Outcome] = None

    def record(stage: str, error: Optional[BaseException]) -> None:
        nonlocal worst
        if error is None:
            stages[stage] = PASS
            return
        outcome = from_exception(error, stage, allowed)
        stages[stage] = outcome.status
        if worst is None or (outcome.status == UNEXPECTED and worst.status != UNEXPECTED):
            worst = outcome

    try:
        if gguf.get("general.architecture") == "dflash":   # a drafter: opened as its target's draft model
            with elelem.LLM(drafter_target(), n_ctx=N_CTX, n_threads=1, draft_model=str(path)) as llm:
                llm.generate_tokens([llm.n_vocab // 2], 2)
                llm.engine.mtp.draft(0, [0, 1, llm.n_vocab - 1], {}, 3)   # an injection and a block
        else:
            with elelem.LLM(path, n_ctx=N_CTX, n_threads=1) as llm:
                llm.eval([0, llm.n_vocab - 1])
                if hasattr(llm, "generate_tokens"):
                    llm.generate_tokens([llm.n_vocab // 2], 2)
        record("model", None)
    except Exception as error:  # noqa: BLE001
        record("model", error)

    if gguf.get("tokenizer.ggml.model") not in (None, "none"):
        try:
            validate_tokenizer_metadata(gguf)
            tokenizer = Tokenizer.from_metadata(gguf.metadata)
            ids = tokenizer.encode(SAMPLE_TEXT, special=True)
            tokenizer.decode(ids, special=True)
            tokenizer.decode(ids)
            record("tokenizer", None)
            template = ChatTemplate.from_metadata(gguf.metadata, token_text=tokenizer.token_text)
            template.render(MESSAGES)
            record("template", None)
        except Exception as error:  # noqa: BLE001
            record("template" if "tokenizer" in stages else "tokenizer", error)

    if worst is not None:
        worst.stages = stages
        return worst
    return Outcome(PASS, "all", stages=stages)


_DRAFTER_TARGET: Optional[Path] = None


def drafter_target() -> Path:
    """The target a drafter case drafts for (seeds.DRAFTER_TARGET), written once per process."""
    global _DRAFTER_TARGET
    if _DRAFTER_TARGET is None:
        import atexit
        import os
        import tempfile
        from .seeds import DRAFTER_TARGET, write_seed
        path = Path(tempfile.gettempdir()) / f"elelem-fuzz-drafter-target-{os.getpid()}.gguf"
        _DRAFTER_TARGET = write_seed(path, DRAFTER_TARGET)
        atexit.register(path.unlink, missing_ok=True)
    return _DRAFTER_TARGET


# ----------------------------------------------------------------------------- parent side


class GGUFCases:
    """Writes mutated GGUF case files (and their fixture form)."""

    target = "gguf"
    suffix = ".gguf"

    def __init__(self, seed_dir: Path, *, synthetic: bool = True, real: tuple[str, ...] = (),
                 copy_data: bool = False):
        from .gguf_mutator import Mutator, load_base
        from .seeds import cached_real_models, write_synthetic_seeds

        bases = []
        if synthetic:
            bases += [load_base(p, synthetic=True) for p in write_synthetic_seeds(seed_dir)]
        if real:
            bases += [load_base(p, synthetic=False) for p in cached_real_models(real)]
        self.mutator = Mutator(bases)
        self.copy_data = copy_data

    def write(self, seed: int, index: int, directory: Path) -> tuple[Path, dict]:
        from .gguf_mutator import materialize
        base, mutant = self.mutator.make(seed, index)
        path = directory / f"gguf-{seed}-{index}{self.suffix}"
        materialize(mutant.pieces, path, copy_data=self.copy_data)
        info = {"base": base.name, "ops": mutant.ops, "input": fixture_input(mutant.pieces)}
        return path, info


def fixture_input(pieces) -> dict:
    """The mutant in a self-contained form: literal bytes inline, real tensor data by model name."""
    from .gguf_mutator import SMALL_RANGE, Zeros
    out = []
    for piece in pieces:
        if isinstance(piece, bytes):
            out.append({"zlib_b64": base64.b64encode(zlib.compress(piece, 9)).decode()})
        elif isinstance(piece, Zeros):
            out.append({"zeros": piece.length})
        elif piece.length <= SMALL_RANGE:  # a synthetic seed's data: inline it
            with open(piece.path, "rb") as f:
                f.seek(piece.offset)
                data = f.read(piece.length)
            out.append({"zlib_b64": base64.b64encode(zlib.compress(data, 9)).decode()})
        else:
            out.append({"model_file": piece.path.name, "offset": piece.offset, "length": piece.length})
    return {"pieces": out}


def write_fixture_input(data: dict, out: Path, *, copy_data: bool = False) -> Path:
    """Rebuild a GGUF case file from :func:`fixture_input`'s form.

    A piece of a packaged model is read from elelem's cache (FileNotFoundError
    when that model is not there).
    """
    from elelem.model.hub import cache_dir
    from .gguf_mutator import FileRange, Zeros, materialize
    pieces = []
    for piece in data["pieces"]:
        if "zlib_b64" in piece:
            pieces.append(zlib.decompress(base64.b64decode(piece["zlib_b64"])))
        elif "zeros" in piece:
            pieces.append(Zeros(piece["zeros"]))
        else:
            source = cache_dir() / piece["model_file"]
            if not source.is_file():
                raise FileNotFoundError(f"the fixture needs the packaged model {piece['model_file']}")
            pieces.append(FileRange(source, piece["offset"], piece["length"]))
    return materialize(pieces, out, copy_data=copy_data)


def needs_real_model(data: dict) -> bool:
    return any("model_file" in piece for piece in data["pieces"])

