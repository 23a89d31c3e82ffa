"""The seed and the time budget of the test suite's fuzz campaigns (tests/test_fuzz.py).

Each test session fuzzes with a new seed, so CI explores new cases on every
run instead of replaying the same ones; the seed is printed at the end of
pytest's report and in every failure, and ``ELELEM_FUZZ_SEED=<seed>``
replays it.
The campaigns are bounded by time, not by a case count, so the suite takes
about as long on any machine: ``ELELEM_FUZZ_SECONDS`` (default
:data:`DEFAULT_SECONDS`) is shared out between the targets.

A failure with a new signature is saved as a crasher fixture (status
``"open"``) in ``ELELEM_FUZZ_FIXTURES``, by default the repository's
``tests/support/fixtures/crashers/``, so the input that found it is kept even when
the seed's case numbering later changes.
"""
from __future__ import annotations

import functools
import os
import secrets
from pathlib import Path

SEED_ENV = "ELELEM_FUZZ_SEED"
SECONDS_ENV = "ELELEM_FUZZ_SECONDS"
FIXTURES_ENV = "ELELEM_FUZZ_FIXTURES"
# The campaigns overrun it by a batch each: about two minutes in all on this project's CI machine.
DEFAULT_SECONDS = 105.0


@functools.lru_cache(maxsize=None)
def campaign_seed() -> int:
    """``$ELELEM_FUZZ_SEED``, else a random 32-bit seed drawn once per process."""
    given = os.environ.get(SEED_ENV, "").strip()
    if given:
        return int(given, 0)
    return secrets.randbelow(2**32)


def campaign_seconds(share: float) -> float:
    """This target's part of the session's fuzzing time (``share`` of the total)."""
    total = float(os.environ.get(SECONDS_ENV, "") or DEFAULT_SECONDS)
    return total * share


def fixtures_dir() -> Path:
    from .crashers import FIXTURES_DIR
    return Path(os.environ[FIXTURES_ENV]) if os.environ.get(FIXTURES_ENV) else FIXTURES_DIR


def header() -> str:
    seed = campaign_seed()
    return (f"fuzz campaigns: seed {seed} (replay: {SEED_ENV}={seed}), "
            f"{campaign_seconds(1.0):g} s in all ({SECONDS_ENV})")
