"""``elelem chat``: an interactive conversation, with prefix reuse across turns.

Each turn sends the whole conversation through the chat template; the
session's cache already holds everything up to the last answer, so only the
new user message is evaluated.
"""
from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

from ..errors import ContextLimitError, InvalidArgumentError
from .interrupt import AnswerInterrupts
from .loading import open_llm
from .output import print_stats, stream_answer

HELP = ("/reset starts a new conversation, /image PATH attaches an image to the next message (with a projector), "
        "/exit quits (or Ctrl-D); Ctrl-C stops an answer.")


def main(args: argparse.Namespace) -> int:
    interrupts = AnswerInterrupts()
    interrupts.install()
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - not on every platform
            pass
    with open_llm(args) as llm:
        if interactive:
            print(f"elelem chat with {llm.path.name}. {HELP}", file=sys.stderr)
        history = _fresh_history(args.system)
        images: list[dict] = []   # image parts for the next user message (/image)
        while True:
            line = _read_line(interactive)
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if text in ("/exit", "/quit", "/bye"):
                    break
                if text == "/reset":
                    history = _fresh_history(args.system)
                    print("[new conversation]", file=sys.stderr)
                elif text == "/help":
                    print(HELP, file=sys.stderr)
                elif text.split()[0] == "/image":
                    part = _image_part(text[len("/image"):].strip(), llm)
                    if part is not None:
                        images.append(part)
                        print(f"[image attached to the next message: {len(images)}]", file=sys.stderr)
                else:
                    print(f"unknown command {text.split()[0]}; {HELP}", file=sys.stderr)
                continue
            content = line.rstrip("\n")
            history.append({"role": "user", "content": images + [{"type": "text", "text": content}] if images
                            else content})
            images = []
            try:
                stream = llm.chat_stream(history, max_tokens=args.max_tokens, **args.sampling)
            except ContextLimitError as error:
                history.pop()
                print(f"elelem: {error}; /reset to start over", file=sys.stderr)
                continue
            except InvalidArgumentError as error:   # an image that does not decode, say
                history.pop()
                print(f"elelem: {error}", file=sys.stderr)
                continue
            answer, _ = stream_answer(stream, llm, interrupts)
            # A stopped answer stays in the conversation as far as it got.
            history.append({"role": "assistant", "content": answer})
            if args.stats:
                print_stats(stream)
    return 0


def _fresh_history(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


def _read_line(interactive: bool) -> str | None:
    """The next user line; None at the end of input (Ctrl-D)."""
    while True:
        try:
            if not interactive:
                line = sys.stdin.readline()
                return line if line else None
            return input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return None
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt, not an exit
            print("\n(Ctrl-D or /exit to quit)", file=sys.stderr)


def _image_part(path: str, llm) -> dict | None:
    """An image part for ``/image PATH`` (the file read here, sent as a data: URL)."""
    if llm.images is None:
        print("elelem: images need the model's projector file: start with --mmproj FILE (a model from Hugging "
              "Face comes with the one its repository ships)", file=sys.stderr)
        return None
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as error:
        print(f"elelem: cannot read {path}: {error.strerror or error}", file=sys.stderr)
        return None
    return {"type": "image_url",
            "image_url": {"url": "data:application/octet-stream;base64," + base64.b64encode(data).decode()}}
