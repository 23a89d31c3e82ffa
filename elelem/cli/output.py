"""Writing an answer to stdout as it streams, and the optional stats line on stderr."""
from __future__ import annotations

import sys

from .interrupt import AnswerInterrupts


def stream_answer(stream, session, interrupts: AnswerInterrupts) -> tuple[str, bool]:
    """Print ``stream``'s deltas as they come; returns (the text, whether Ctrl-C stopped it)."""
    pieces: list[str] = []
    stopped = False
    with interrupts.generating(session):
        try:
            for delta in stream:
                pieces.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
        except KeyboardInterrupt:
            stopped = True
        finally:
            stream.close()
        stopped = stopped or interrupts.interrupted
    text = "".join(pieces)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
        sys.stdout.flush()
    if stopped:
        print("[stopped]", file=sys.stderr)
    return text, stopped


def print_stats(stream) -> None:
    decode = stream.completion_tokens / stream.decode_seconds if stream.decode_seconds > 0 else 0.0
    new = stream.prompt_tokens - stream.reused_tokens
    print(f"[prompt: {stream.prompt_tokens} tokens, {stream.reused_tokens} reused, {new} evaluated "
          f"in {stream.prefill_seconds:.2f} s | answer: {stream.completion_tokens} tokens, {decode:.1f} tok/s"
          f"{_drafts(stream)} | finish: {stream.finish_reason or 'interrupted'}]", file=sys.stderr)


def _drafts(stream) -> str:
    """Speculative decoding's share of the answer, when it drafted anything."""
    if not stream.drafted_tokens:
        return ""
    return f" ({stream.accepted_tokens} of {stream.drafted_tokens} drafted tokens accepted)"
