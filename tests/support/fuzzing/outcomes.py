"""What counts as a pass, and how a case's result is written down.

A case *passes* when the code under test returns, or raises one of the
exceptions its target allows (a named, documented refusal).  It *fails* when:

* the process dies: a signal (``SIGSEGV``, ``SIGABRT`` from a ``GGML_ASSERT``),
  or a sanitizer report (the runner is started with ``abort_on_error=1``, so
  that is a ``SIGABRT`` too);
* it hangs: no result within the case's time limit (the driver kills it);
* it raises anything else (``TypeError``, ``KeyError``, ``OverflowError``...):
  an input the code did not anticipate, which a caller cannot catch by type;
* it breaks an invariant the target checks (a token id out of range, a render
  that ran far past its own time limit).
"""
from __future__ import annotations

import signal
import traceback
from dataclasses import asdict, dataclass, field
from typing import Optional

PASS = "pass"              # returned normally
REJECTED = "rejected"      # raised an allowed exception
UNEXPECTED = "unexpected"  # raised an exception type the target does not allow
INVARIANT = "invariant"    # returned, but the result breaks a rule the target checks
CRASH = "crash"            # the process died (decided by the driver)
HANG = "hang"              # the process ran past the case's time limit (decided by the driver)

FAILURES = frozenset({UNEXPECTED, INVARIANT, CRASH, HANG})


@dataclass
class Outcome:
    status: str
    stage: str = ""                  # where it ended: read, model, tokenizer, template, encode, render...
    error: str = ""                  # exception class name, or the signal
    detail: str = ""                 # message or traceback (trimmed)
    seconds: float = 0.0
    stages: dict = field(default_factory=dict)  # stage -> status, for the campaign statistics

    @property
    def failed(self) -> bool:
        return self.status in FAILURES

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Outcome":
        return cls(**data)


def from_exception(error: BaseException, stage: str, allowed: tuple[type, ...]) -> Outcome:
    """REJECTED for an allowed exception, UNEXPECTED (with the traceback) for any other."""
    name = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
    if isinstance(error, allowed):
        return Outcome(REJECTED, stage, name, _trim(str(error), 300))
    tb = "".join(traceback.format_exception(error))
    return Outcome(UNEXPECTED, stage, name, _trim(tb, 4000))


def describe_returncode(returncode: Optional[int]) -> str:
    if returncode is None:
        return "killed (time limit)"
    if returncode < 0:
        try:
            return f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _trim(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2:]
