"""``elelem run``: one prompt in, the answer streamed to stdout."""
from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

from ..model.hub import is_hub_reference
from .interrupt import AnswerInterrupts
from .loading import open_llm
from .output import print_stats, stream_answer


def main(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        print("elelem: error: the prompt read from stdin is empty", file=sys.stderr)
        return 2
    if args.image and (args.raw or args.mmproj is False or (args.mmproj is None and not is_hub_reference(args.model))):
        print("elelem: error: --image needs the model's projector (--mmproj FILE, or the one its Hugging Face "
              "repository ships), and the chat template", file=sys.stderr)
        return 2
    interrupts = AnswerInterrupts()
    interrupts.install()
    with open_llm(args) as llm:
        if args.image and llm.images is None:   # a Hub model whose repository ships none
            print("elelem: error: --image needs the model's projector: give --mmproj FILE (mmproj-*.gguf)",
                  file=sys.stderr)
            return 2
        options = dict(args.sampling, max_tokens=args.max_tokens)
        if args.raw or not llm.has_chat_template:
            stream = llm.stream(prompt, **options)
        else:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": _content(prompt, args.image or [])})
            stream = llm.chat_stream(messages, **options)
        _, stopped = stream_answer(stream, llm, interrupts)
        if args.stats:
            print_stats(stream)
    return 130 if stopped else 0


def _content(prompt: str, images: list[str]):
    """The user message's content: the prompt, after the images (read as data: URLs, so that
    any path on the command line is allowed without an image directory)."""
    if not images:
        return prompt
    parts: list[dict] = []
    for path in images:
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise SystemExit(f"elelem: error: cannot read the image {path}: {error.strerror or error}") from None
        url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts + [{"type": "text", "text": prompt}]
