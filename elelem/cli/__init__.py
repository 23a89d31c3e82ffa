"""The ``elelem`` command line: ``run``, ``chat``, ``info``, ``bench``, ``serve``, ``models``, ``pull``, ``rm``.

The CLI is the user interface, so unlike the library it prints: answers to
stdout, progress and status to stderr.  Every failure the user can cause (a
bad argument, a missing or broken model, Ctrl-C) ends with a one-line message
and an exit status -- 2 for bad arguments, 1 for errors, 130 for Ctrl-C --
never a traceback (``-vv`` shows one for unexpected errors).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

from ..errors import ElelemError
from .parser import build_parser, check_arguments

log = logging.getLogger("elelem")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with status 2 on a bad argument
    check_arguments(parser, args)
    _configure_logging(args.verbose)
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        print("\nelelem: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`elelem run ... | head`): stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ElelemError, OSError) as error:
        print(f"elelem: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # a bug: say so in one line, keep the traceback for -vv
        log.debug("unexpected error", exc_info=True)
        print(f"elelem: unexpected error: {type(error).__name__}: {error} (run with -vv for details)",
              file=sys.stderr)
        return 1


_handler: Optional[logging.Handler] = None


def _configure_logging(verbosity: int) -> None:
    global _handler
    logger = logging.getLogger("elelem")
    if _handler is not None:  # main() may run more than once in a process (tests)
        logger.removeHandler(_handler)
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG)


__all__ = ["main"]
