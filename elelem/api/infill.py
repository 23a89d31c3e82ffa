"""Fill-in-the-middle prompts with repository context, as llama.cpp's server builds them for ``/infill``.

:func:`infill_ids` follows ``format_prompt_infill`` (llama.cpp,
tools/server/server-common.cpp) token for token.  Its layout is the
repository-level format of Qwen2.5-Coder (arXiv:2409.12186), which
Qwen3-Coder keeps::

    [FIM_REP]myproject\\n
    [FIM_SEP]{filename}\\n{text}      one per extra file
    [FIM_SEP]filename\\n
    [BOS][FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

* The FIM tokens are the GGUF's (``tokenizer.ggml.fim_*_token_id``, or the
  tokens llama.cpp recognises by their text, such as ``<|fim_prefix|>``,
  ``<|repo_name|>`` and ``<|file_sep|>``; see ``elelem.text.tokenizer.vocab``).
  Without FIM_REP the project line is left out; without FIM_SEP each extra
  file is introduced by a plain ``\\n\\n--- snippet ---\\n\\n`` instead, and
  the current file's line is left out.
* The project and current-file names are llama.cpp's placeholders
  (``myproject``, ``filename``): the model was trained on real names, but
  llama.cpp's clients expect these prompts, so they are kept.
* ``prefix`` and ``suffix`` are plain text (control-token text in the code
  stays text) or llama.cpp's mixed lists of text and token ids; ``prompt``
  (editor plugins send the cursor's line up to the cursor) follows the
  prefix, tokenized with control tokens parsed, as llama.cpp's server does.
* Budgets, as llama.cpp picks them: the prefix keeps its last ``3/4 *
  n_batch`` tokens and the suffix its first ``n_batch/4 - 2 - len(prompt)``,
  so the code around the cursor fits one batch; the extra context keeps its
  last ``n_ctx - n_batch - 2 * n_predict`` tokens (``n_predict`` -1, no
  limit, leaves ``n_ctx - n_batch + 2``), cut wherever that falls.
  ``n_batch`` defaults to llama-server's 2048; with ``n_ctx`` at or below it
  almost no extra context fits, as in llama.cpp.
* ``suffix_first`` is llama.cpp's ``--spm-infill`` order: FIM_SUF before FIM_PRE.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..errors import InvalidArgumentError
from .assets import ModelAssets

#: llama-server's logical batch size (``-b``), which sizes the prefix and suffix kept.
DEFAULT_N_BATCH = 2048
#: llama.cpp's placeholders for the project, a file given without a name, and the current file.
PROJECT_NAME, UNNAMED_FILE, CURRENT_FILE = "myproject", "tmp", "filename"
#: What separates extra files for a model without FIM_SEP (llama.cpp writes it as bytes "to avoid
#: confusing the AI" reading its source).
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"

#: Text, or llama.cpp's mixed list of texts and token ids.
Piece = Union[str, Sequence[Union[str, int]]]


@dataclass(frozen=True)
class ExtraFile:
    """One file of repository context: its name (``tmp`` when not given, as llama.cpp) and its text."""

    text: str
    filename: str = UNNAMED_FILE


def extra_files(extra: Any) -> list[ExtraFile]:
    """``extra`` checked: llama.cpp's list of ``{"text": str, "filename": str}`` chunks (the filename
    optional), :class:`ExtraFile`\\ s, or a mapping of file names to texts; None is no extra context."""
    if extra is None:
        return []
    if isinstance(extra, Mapping):
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
            raise InvalidArgumentError("extra as a mapping must map file names to their texts (strings)")
        return [ExtraFile(text, name) for name, text in extra.items()]
    if isinstance(extra, (str, bytes)) or not isinstance(extra, Sequence):
        raise InvalidArgumentError('input_extra must be an array of {"filename": string, "text": string}')
    files = []
    for index, chunk in enumerate(extra):
        if isinstance(chunk, ExtraFile):
            files.append(chunk)
            continue
        text = chunk.get("text") if isinstance(chunk, Mapping) else None
        if not isinstance(text, str):
            raise InvalidArgumentError(f'input_extra[{index}] must contain a "text" field with a string value')
        filename = chunk.get("filename", UNNAMED_FILE)
        if not isinstance(filename, str):
            raise InvalidArgumentError(f'input_extra[{index}]\'s "filename" field must be a string')
        files.append(ExtraFile(text, filename))
    return files


def fim_token_ids(assets: ModelAssets) -> tuple[int, int, int]:
    """FIM_PRE, FIM_SUF and FIM_MID; a model lacking any raises :class:`InvalidArgumentError` naming them."""
    ids = [assets.tokenizer.special_id(name) for name in ("fim_pre", "fim_suf", "fim_mid")]
    missing = [f"{what} token is missing." for what, token in zip(("prefix", "suffix", "middle"), ids)
               if token is None]
    if missing:
        # llama.cpp's words, then where the tokens come from.
        raise InvalidArgumentError(
            f"Infill is not supported by this model: {' '.join(missing)} {assets.path.name} has no "
            f"fill-in-the-middle tokens (tokenizer.ggml.fim_pre_token_id, fim_suf_token_id, fim_mid_token_id, "
            f"or tokens such as <|fim_prefix|>); use a code model trained for it, e.g. qwen2.5-coder-0.5b")
    pre, suf, mid = ids
    assert pre is not None and suf is not None and mid is not None
    return pre, suf, mid


def infill_ids(assets: ModelAssets, prefix: Piece, suffix: Piece, *, n_ctx: int, extra: Any = None,
               prompt: Union[str, Sequence[int]] = "", n_batch: int = DEFAULT_N_BATCH, n_predict: int = -1,
               suffix_first: bool = False) -> list[int]:
    """The prompt ids of an infill request, as llama.cpp's ``format_prompt_infill`` builds them (see
    the module's docstring); ``n_ctx`` is the context one request gets (llama.cpp's slot context)."""
    pre, suf, mid = fim_token_ids(assets)
    for name, value, low in (("n_ctx", n_ctx, 1), ("n_batch", n_batch, 1), ("n_predict", n_predict, -1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {value!r}")
    files = extra_files(extra)
    tokenizer = assets.tokenizer
    rep, sep = tokenizer.special_id("fim_rep"), tokenizer.special_id("fim_sep")

    extra_tokens: list[int] = []
    if rep is not None:
        extra_tokens += [rep, *_plain(assets, PROJECT_NAME + "\n")]
    for file in files:
        if sep is not None:
            extra_tokens += [sep, *_plain(assets, file.filename + "\n")]
        else:
            extra_tokens += _plain(assets, SNIPPET_SEPARATOR)
        extra_tokens += _plain(assets, file.text)
    if sep is not None:
        extra_tokens += [sep, *_plain(assets, CURRENT_FILE + "\n")]

    prefix_ids = _mixed(assets, prefix, "input_prefix")
    suffix_ids = _mixed(assets, suffix, "input_suffix")
    prompt_ids = _prompt(assets, prompt)
    # The code around the cursor fits one batch, prefix to suffix 3:1 (llama.cpp: "TODO: configurable?").
    n_prefix_take = min(len(prefix_ids), 3 * (n_batch // 4))
    n_suffix_take = min(len(suffix_ids), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    # The rest of the context, less room to generate, holds the end of the extra context.
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))

    head = [pre, *prefix_ids[len(prefix_ids) - n_prefix_take:], *prompt_ids]
    tail = [suf, *suffix_ids[:n_suffix_take]]
    if suffix_first:
        head, tail = tail, head
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    # The extra context goes before the BOS, where llama.cpp inserts it.
    return extra_tokens[len(extra_tokens) - n_extra_take:] + bos + head + tail + [mid]


def _plain(assets: ModelAssets, text: str, special: bool = False) -> list[int]:
    # llama.cpp's common_tokenize(vocab, text, add_special=false, ...): neither BOS nor EOS.
    tokenizer = assets.tokenizer
    with assets.tokenizer_lock:
        return tokenizer.encode(text, add_bos=False, add_eos=False, special=special)


def _mixed(assets: ModelAssets, piece: Any, name: str) -> list[int]:
    """llama.cpp's ``tokenize_mixed`` with nothing added and control-token text left as text."""
    if isinstance(piece, str):
        return _plain(assets, piece)
    if isinstance(piece, Sequence) and not isinstance(piece, (bytes, bytearray)):
        ids: list[int] = []
        for item in piece:
            if isinstance(item, str):
                ids += _plain(assets, item)
            elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < assets.n_vocab:
                ids.append(item)
            else:
                raise InvalidArgumentError(f"{name} must be a string or a list of strings and token ids "
                                           f"(in [0, {assets.n_vocab})), got an item {item!r}")
        return ids
    raise InvalidArgumentError(f"{name} must be a string or a list of strings and token ids, "
                               f"got {type(piece).__name__}")


def _prompt(assets: ModelAssets, prompt: Any) -> list[int]:
    # The server tokenizes the prompt with control tokens parsed and nothing added.
    if isinstance(prompt, str):
        return _plain(assets, prompt, special=True)
    if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool)
                                            and 0 <= t < assets.n_vocab for t in prompt):
        return list(prompt)
    raise InvalidArgumentError(f"prompt must be a string or a list of token ids, got {prompt!r}")
