"""``elelem run``: one prompt in, the answer streamed to stdout."""
from __future__ import annotations

import argparse
import sys

from .interrupt import AnswerInterrupts
from .loading import open_llm
from .output import print_stats, stream_answer


def main(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        print("elelem: error: the prompt read from stdin is empty", file=sys.stderr)
        return 2
    interrupts = AnswerInterrupts()
    interrupts.install()
    with open_llm(args) as llm:
        options = dict(args.sampling, max_tokens=args.max_tokens)
        if args.raw or not llm.has_chat_template:
            stream = llm.stream(prompt, **options)
        else:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": prompt})
            stream = llm.chat_stream(messages, **options)
        _, stopped = stream_answer(stream, llm, interrupts)
        if args.stats:
            print_stats(stream)
    return 130 if stopped else 0
