"""From what the caller gives (text, token ids, chat messages) to prompt ids, and the token budget.

Tokenization follows llama-cpp-python and llama.cpp:

* a text prompt is tokenized with the model's own BOS setting and with
  ``special=True``, so a hand-written template (``"<|im_start|>user\\n…"``)
  becomes the control tokens it names; a list of ids is used as it is;
* a chat is rendered with the model's chat template and the whole rendered
  text is tokenized with ``special=True`` -- the template's markup must become
  control tokens.  As in llama.cpp, that includes the messages' content: a
  message whose text contains ``<|im_end|>`` produces that token.  Treat
  message content from untrusted sources accordingly;
* when the model adds a BOS itself and the template also printed one, the
  duplicate is dropped (llama.cpp strips the template's);
* a ``suffix`` makes a fill-in-the-middle prompt of a text prompt and the
  suffix, as llama.cpp's infill does (:func:`infill_prompt_ids`);
* a message's content may be OpenAI's list of content parts: its text parts
  are joined; any other part (an image, audio) is refused, since a text
  model cannot be shown it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from ..errors import ContextLimitError, InvalidArgumentError
from ..text import template_sandbox
from ..text.chat_template import ChatTemplate
from .assets import ModelAssets

Prompt = Union[str, Sequence[int]]


def completion_prompt_ids(assets: ModelAssets, prompt: Prompt,
                          check_ids: Callable[[Sequence[int], str], list[int]]) -> list[int]:
    if isinstance(prompt, (bytes, bytearray)):
        prompt = bytes(prompt).decode("utf-8", "replace")
    if isinstance(prompt, str):
        ids = assets.tokenize(prompt, special=True)
        if not ids:
            bos = assets.tokenizer.bos_id
            if bos is None:
                raise InvalidArgumentError("the prompt is empty")
            ids = [bos]  # as llama-cpp-python: an empty prompt starts from BOS
        return ids
    return check_ids(prompt, "prompt")


#: The fill-in-the-middle tokens a suffix needs, by llama.cpp's names.
FIM_TOKENS = ("fim_pre", "fim_suf", "fim_mid")


def infill_prompt_ids(assets: ModelAssets, prefix: Prompt, suffix: str,
                      check_ids: Callable[[Sequence[int], str], list[int]], *, suffix_first: bool = False) -> list[int]:
    """The fill-in-the-middle prompt asking for the text between ``prefix`` and ``suffix``.

    As llama.cpp builds it (its infill example and the server's ``/infill``,
    without their repository-level context): ``[BOS] FIM_PRE prefix FIM_SUF
    suffix FIM_MID``, BOS only where the model adds one, ``prefix`` (text or
    token ids) and ``suffix`` tokenized as plain text; ``suffix_first`` is
    llama.cpp's ``spm_infill`` order, ``FIM_SUF suffix FIM_PRE prefix FIM_MID``.
    A model without the three FIM tokens raises :class:`InvalidArgumentError`.
    """
    if not isinstance(suffix, str):
        raise InvalidArgumentError(f"suffix must be a string, got {type(suffix).__name__}")
    tokenizer = assets.tokenizer
    pre, suf, mid = (tokenizer.special_id(name) for name in FIM_TOKENS)
    if pre is None or suf is None or mid is None:
        raise InvalidArgumentError(
            f"suffix asks for fill-in-the-middle, but {assets.path.name} has no FIM tokens (prefix, suffix and "
            f"middle: tokenizer.ggml.fim_pre_token_id, fim_suf_token_id, fim_mid_token_id, or tokens such as "
            f"<|fim_prefix|>); use a code model trained for it, e.g. qwen2.5-coder-0.5b")
    if isinstance(prefix, (bytes, bytearray)):
        prefix = bytes(prefix).decode("utf-8", "replace")
    if isinstance(prefix, str):
        prefix_ids = assets.tokenize(prefix, add_bos=False, special=False)
    else:
        prefix_ids = check_ids(prefix, "prompt")
    suffix_ids = assets.tokenize(suffix, add_bos=False, special=False)
    head, tail = [suf, *suffix_ids], [pre, *prefix_ids]
    if not suffix_first:
        head, tail = tail, head
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return bos + head + tail + [mid]


def chat_prompt_ids(assets: ModelAssets, messages: Sequence[Mapping[str, Any]], *,
                    tools: Optional[Sequence[Mapping[str, Any]]] = None, **template_vars: Any) -> list[int]:
    return chat_prompt(assets, messages, tools=tools, **template_vars)[1]


def chat_prompt(assets: ModelAssets, messages: Sequence[Mapping[str, Any]], *,
                tools: Optional[Sequence[Mapping[str, Any]]] = None, **template_vars: Any) -> tuple[str, list[int]]:
    """The rendered prompt text and its ids (the text says whether the template opened a reasoning block)."""
    text = render_chat(assets.chat_template, messages, tools=tools, **template_vars)
    return text, _chat_ids(assets, text)


def render_chat(template: ChatTemplate, messages: Sequence[Mapping[str, Any]], *,
                tools: Optional[Sequence[Mapping[str, Any]]] = None, add_generation_prompt: bool = True,
                **template_vars: Any) -> str:
    """A chat request's prompt, as llama.cpp's server renders it: the template gets
    :func:`template_defaults`, which ``template_vars`` (``chat_template_kwargs``) override."""
    return template.render(text_messages(messages), add_generation_prompt=add_generation_prompt, tools=tools,
                           **{**template_defaults(), **template_vars})


def template_defaults() -> dict[str, Any]:
    """The variables llama.cpp hands every chat template (common/chat.cpp): ``enable_thinking``
    (true unless the request turns it off), and today's date as ``datetime`` ("Jan 15 2026")
    and ``date_string`` ("15 Jan 2026", which Llama 3.x's templates print; without it they
    print their own default, "26 Jul 2024")."""
    today = template_sandbox.now()
    return {"enable_thinking": True, "datetime": today.strftime("%b %d %Y"),
            "date_string": today.strftime("%d %b %Y")}


def _chat_ids(assets: ModelAssets, text: str) -> list[int]:
    ids = assets.tokenize(text, special=True)
    bos = assets.tokenizer.bos_id
    if bos is not None and ids[:2] == [bos, bos]:
        ids = ids[1:]
    if not ids:
        raise InvalidArgumentError("the chat template rendered an empty prompt")
    return ids


#: What the chat template gets from the request itself, not from chat_template_kwargs.
_OWN_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def template_variables(kwargs: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """A request's ``chat_template_kwargs``, checked: a mapping of names to values,
    none of them one the request itself sets (messages, tools, ...)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise InvalidArgumentError("chat_template_kwargs must map variable names to values")
    clash = sorted(_OWN_VARIABLES & set(kwargs))
    if clash:
        raise InvalidArgumentError(f"chat_template_kwargs cannot set {clash[0]!r}: the request itself gives it")
    return dict(kwargs)


def text_messages(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """``messages`` with every list of content parts joined into its text."""
    if isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)) and any(
            isinstance(m, Mapping) and isinstance(m.get("content"), list) for m in messages):
        return [{**m, "content": content_text(m["content"], f"messages[{i}].content")}
                if isinstance(m, Mapping) and isinstance(m.get("content"), list) else m
                for i, m in enumerate(messages)]
    return messages


#: Content parts that carry an image: OpenAI's chat, the Responses API's, Anthropic's (api/images.py reads them).
IMAGE_PART_TYPES = ("image_url", "input_image", "image")


def content_text(parts: list, where: str = "content") -> str:
    """The text of OpenAI content parts (``[{"type": "text", "text": ...}, ...]``)."""
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in IMAGE_PART_TYPES:
            raise InvalidArgumentError(f"{where}[{index}] is an image, and this model was opened without a "
                                       f"projector: it reads text only (open it with mmproj=, its mmproj file)")
        if kind != "text":
            raise InvalidArgumentError(f"{where}[{index}] is a {kind or type(part).__name__!r} part; "
                                       f"this model reads text only: use {{'type': 'text', 'text': ...}} parts")
        if not isinstance(part.get("text"), str):
            raise InvalidArgumentError(f"{where}[{index}]['text'] must be a string")
        texts.append(part["text"])
    return "".join(texts)


def token_budget(n_prompt: int, max_tokens: Optional[int], n_ctx: int) -> int:
    """How many tokens may be generated: ``max_tokens``, or all the room left when None.

    Raises :class:`ContextLimitError`, naming the numbers, when the prompt plus
    ``max_tokens`` does not fit in ``n_ctx`` -- before anything is computed.
    """
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 0):
        raise InvalidArgumentError(f"max_tokens must be a non-negative integer or None, got {max_tokens!r}")
    if max_tokens is None:
        if n_prompt >= n_ctx:
            raise ContextLimitError(
                f"the prompt has {n_prompt} tokens, which leaves no room to generate in n_ctx={n_ctx}")
        return n_ctx - n_prompt
    if n_prompt + max_tokens > n_ctx:
        raise ContextLimitError(
            f"the prompt has {n_prompt} tokens and max_tokens is {max_tokens}: "
            f"{n_prompt + max_tokens} tokens do not fit in n_ctx={n_ctx}")
    return max_tokens
