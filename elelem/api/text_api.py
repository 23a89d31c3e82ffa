"""The text API every session has: tokenize, generate, stream, chat, and llama-cpp-python's dicts.

Sampling keywords (all optional; defaults are llama-cpp-python's, see
:class:`~elelem.sampling.sampler.SamplingParams`): ``temperature`` (0.8; 0.2 for the
chat methods, as llama-cpp-python's ``create_chat_completion``; 0 is greedy),
``top_k`` (40), ``top_p`` (0.95), ``min_p`` (0.05), ``typical_p`` (1.0),
``repeat_penalty`` (1.0), ``repeat_last_n`` (64), ``frequency_penalty`` (0.0),
``presence_penalty`` (0.0), ``logit_bias`` ({}), ``seed`` (None: fresh
randomness; the same seed gives the same text).  ``speculative`` (None: the
LLM's setting) turns speculative decoding on or off for one call.
``lora`` (None: the LLM's scales) sets the LoRA adapters' scales for one call
(:mod:`elelem.api.lora`: ``{id: scale}``, ``[{"id": .., "scale": ..}]`` or a
scale for each adapter).
``logprobs`` (None: off; N in 0..20) records each generated token's
log-probability and its N likeliest alternatives on the stream
(``TextStream.logprobs``); the ``create_*`` methods report them in
llama-cpp-python's and OpenAI's shapes.  A call with logprobs decodes
token by token unless ``speculative=True`` is given: batched verification
steps round differently, and the values would then differ from llama.cpp's.

``max_tokens`` is the most tokens to generate.  None (the default of
``generate``, ``stream``, ``chat`` and ``chat_stream``) means: until an
end-of-generation token, a stop string, or the end of the context window.
The prompt plus ``max_tokens`` must fit in ``n_ctx``, else
:class:`~elelem.errors.ContextLimitError` is raised before any compute.
``stop`` is a string or a list of strings; the text ends before the first
one, and no part of one is ever streamed.

Structured output (:mod:`elelem.api.structured`): every method takes
``grammar`` (GBNF text, as llama.cpp), and the chat methods take
``response_format`` (``{"type": "json_object"}``, optionally with a
``"schema"``, or ``{"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}``).  Each token is then drawn among those that keep the output
valid; a schema keyword that cannot be enforced raises
:class:`~elelem.errors.UnsupportedSchemaError` before any compute.

Generation stops at the model's end-of-generation tokens (EOS and the
others the vocabulary marks, e.g. ``<|im_end|>`` and ``<|endoftext|>``).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Sequence, Union

from . import completions
from .assets import ModelAssets
from .generation import TextStream
from .prompts import Prompt, chat_prompt, completion_prompt_ids, infill_prompt_ids, token_budget
from .reasoning import extracts_reasoning, reasoning_messages, reply_parser, template_kwargs
from .structured import output_constraint, output_grammar
from ..errors import GrammarError, InvalidArgumentError
from ..sampling.logprobs import chat_logprobs_count
from ..sampling.constrained import TokenConstraint
from ..sampling.grammar import Grammar
from ..sampling.lazy import LazyConstraint
from ..sampling.sampler import SamplingParams
from ..text.stop_strings import StopArg, normalize_stop
from .tools.parsers import parser_for
from .tools.request import ToolChoice, ToolPlan, messages_for_template, plan_tools, tool_vocabulary

Messages = Sequence[Mapping[str, Any]]

SAMPLING_NAMES = frozenset(f.name for f in dataclasses.fields(SamplingParams))
#: llama-cpp-python's create_chat_completion samples cooler than create_completion.
CHAT_DEFAULTS = {"temperature": 0.2}


class TextAPI:
    """Mixed into :class:`~elelem.api.session.Session`: the methods users call."""

    if TYPE_CHECKING:  # what Session provides
        assets: ModelAssets
        _lock: threading.RLock

        @property
        def n_ctx(self) -> int: ...

        def _check_ids(self, ids: Sequence[int], what: str) -> list[int]: ...

        def _open_stream(self, ids, params, budget, stop, constraint, on_end=None,
                         speculative: Optional[bool] = None, logprobs: Optional[int] = None,
                         preserved: frozenset = frozenset(), lora: Any = None) -> TextStream: ...

    # -- tokens ----------------------------------------------------------------

    def tokenize(self, text: Union[str, bytes], add_bos: Optional[bool] = None,
                 special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_bos`` None follows the model, ``special``
        makes control-token text (``<|im_start|>``) into those tokens."""
        return self.assets.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Sequence[int], special: bool = False) -> bytes:
        """The bytes of ``ids`` (as llama-cpp-python: ``.decode()`` them for text)."""
        return self.assets.tokenizer.decode(ids, special=special)

    # -- plain text ------------------------------------------------------------

    def stream(self, prompt: Prompt, *, max_tokens: Optional[int] = None, stop: StopArg = None,
               grammar: Optional[str] = None, suffix: Optional[str] = None,
               suffix_first: bool = False, **sampling: Any) -> TextStream:
        """An iterator of text deltas continuing ``prompt`` (text or token ids).

        With ``suffix``, the text to go between ``prompt`` and ``suffix``
        (fill-in-the-middle, for models with FIM tokens such as
        Qwen2.5-Coder; see :func:`~elelem.api.prompts.infill_prompt_ids`,
        whose order ``suffix_first`` chooses).
        """
        with self._lock:
            output = output_grammar(grammar=grammar)
            if suffix is None:
                ids = completion_prompt_ids(self.assets, prompt, self._check_ids)
            else:
                ids = infill_prompt_ids(self.assets, prompt, suffix, self._check_ids, suffix_first=suffix_first)
            return self._text_stream(ids, max_tokens, stop, sampling, {}, output_constraint(self.assets, output))

    def generate(self, prompt: Prompt, *, max_tokens: Optional[int] = None, stop: StopArg = None,
                 grammar: Optional[str] = None, suffix: Optional[str] = None, **sampling: Any) -> str:
        """The text continuing ``prompt`` (or, with ``suffix``, filling the gap before it)."""
        with self._lock:  # the whole call, so concurrent calls are serialized
            return self.stream(prompt, max_tokens=max_tokens, stop=stop, grammar=grammar, suffix=suffix,
                               **sampling).text()

    # -- chat ------------------------------------------------------------------

    def chat_stream(self, messages: Messages, *, max_tokens: Optional[int] = None, stop: StopArg = None,
                    tools: Optional[Sequence[Mapping[str, Any]]] = None, tool_choice: ToolChoice = None,
                    response_format: Optional[Mapping[str, Any]] = None, grammar: Optional[str] = None,
                    chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                    reasoning_format: Optional[str] = None, tool_call_format: Optional[str] = None,
                    parallel_tool_calls: Optional[bool] = None, **sampling: Any) -> TextStream:
        """An iterator of the assistant's reply to ``messages``, as text deltas.

        ``messages`` are ``{"role", "content"}`` dicts, rendered with the
        model's chat template (ChatML when it has none); an assistant message
        may carry ``reasoning_content`` (or ``reasoning``).  With ``tools``, the
        deltas are the raw reply in the model's own format, tool-call markup
        and reasoning included (``create_chat_completion`` is the API that
        parses them; the stream's ``reply`` is the parser it uses);
        ``tool_choice``, ``parallel_tool_calls``, ``chat_template_kwargs``,
        ``reasoning_format`` and ``tool_call_format`` work as there.
        """
        with self._lock:
            plan = plan_tools(tools, tool_choice, self.assets.chat_template.source,
                              self._tool_call_format(tool_call_format), parallel_tool_calls)
            output = output_grammar(response_format, grammar)
            return self._chat_text_stream(messages, plan, max_tokens, stop, sampling, output,
                                          chat_template_kwargs=chat_template_kwargs,
                                          reasoning_format=reasoning_format, tool_call_format=tool_call_format)

    def chat(self, messages: Messages, *, max_tokens: Optional[int] = None, stop: StopArg = None,
             tools: Optional[Sequence[Mapping[str, Any]]] = None, tool_choice: ToolChoice = None,
             response_format: Optional[Mapping[str, Any]] = None, grammar: Optional[str] = None,
             chat_template_kwargs: Optional[Mapping[str, Any]] = None, tool_call_format: Optional[str] = None,
             **sampling: Any) -> str:
        """The assistant's reply to ``messages``: its raw text, including any
        tool-call markup and reasoning (see ``chat_stream``)."""
        with self._lock:
            return self.chat_stream(messages, max_tokens=max_tokens, stop=stop, tools=tools,
                                    tool_choice=tool_choice, response_format=response_format,
                                    grammar=grammar, chat_template_kwargs=chat_template_kwargs,
                                    tool_call_format=tool_call_format, **sampling).text()

    # -- llama-cpp-python's dicts ---------------------------------------------

    def create_completion(self, prompt: Prompt, *, max_tokens: Optional[int] = 16, stream: bool = False,
                          stop: StopArg = None, model: Optional[str] = None, grammar: Optional[str] = None,
                          logprobs: Optional[int] = None, echo: bool = False, suffix: Optional[str] = None,
                          **sampling: Any) -> Union[dict, Iterator[dict]]:
        """llama-cpp-python's ``create_completion``: a ``text_completion`` dict, or its chunks.

        As there, ``max_tokens`` defaults to 16, and None or <= 0 means no limit
        but the context window.  ``grammar`` (GBNF text) constrains the text.
        ``logprobs=N`` adds ``choices[0]["logprobs"]``: ``tokens``,
        ``text_offset``, ``token_logprobs`` and ``top_logprobs`` (the N
        likeliest tokens and the chosen one, by text).  ``echo=True`` returns
        the prompt's text followed by the answer (streamed: in the first
        chunk); not with ``logprobs``, which would need the prompt's own.
        ``suffix`` asks for the text between the prompt and it
        (fill-in-the-middle; see :meth:`stream`).
        """
        if echo not in (True, False):
            raise InvalidArgumentError(f"echo must be a boolean, got {echo!r}")
        if echo and logprobs is not None:
            raise InvalidArgumentError("logprobs together with echo are not supported "
                                       "(the prompt's tokens have no log-probabilities here)")
        with self._lock:
            text = self.stream(prompt, max_tokens=_unlimited_if_not_positive(max_tokens), stop=stop,
                               grammar=grammar, logprobs=logprobs, suffix=suffix, **sampling)
            name = model if model is not None else self.assets.model_name
            base = 0 if logprobs is None else completions.text_offset_base(prompt, self.detokenize)
            echoed = completions.prompt_text(prompt, self.detokenize) if echo else ""
            if stream:
                return completions.completion_chunks(text, name, base, echoed)
            return completions.completion(text, name, base, echoed)

    __call__ = create_completion

    def create_chat_completion(self, messages: Messages, *, stream: bool = False,
                               max_tokens: Optional[int] = None, stop: StopArg = None,
                               tools: Optional[Sequence[Mapping[str, Any]]] = None, tool_choice: ToolChoice = None,
                               response_format: Optional[Mapping[str, Any]] = None, grammar: Optional[str] = None,
                               model: Optional[str] = None, logprobs: Optional[bool] = None,
                               top_logprobs: Optional[int] = None, reasoning_format: Optional[str] = None,
                               chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                               tool_call_format: Optional[str] = None, parallel_tool_calls: Optional[bool] = None,
                               **sampling: Any) -> Union[dict, Iterator[dict]]:
        """llama-cpp-python's ``create_chat_completion``: a ``chat.completion`` dict, or its chunks.

        ``tools`` are OpenAI function tools, shown to the model through its
        chat template; calls in the reply come back as ``message.tool_calls``
        (streamed: ``delta.tool_calls``) with ``finish_reason`` ``"tool_calls"``.
        ``tool_choice``: ``"auto"`` (default with tools), ``"none"``,
        ``"required"`` or ``{"type": "function", "function": {"name": ...}}``;
        the last two constrain the reply to a valid call (see :mod:`elelem.api.tools`).
        ``parallel_tool_calls=True`` lets more calls follow the first (default: one, as llama.cpp's server).
        The calls are read in the format the chat template shows (Hermes,
        Qwen3-Coder XML, gpt-oss harmony, Mistral, Llama 3, GLM), or in
        ``tool_call_format`` when given (also ``LLM(tool_call_format=...)``).
        A reasoning model's thinking comes back as ``message.reasoning_content``
        (streamed: ``delta.reasoning_content``), unless ``reasoning_format`` is
        ``"none"`` (default ``"auto"``; see :mod:`elelem.api.reasoning`).
        ``chat_template_kwargs`` are variables for the template, e.g.
        ``{"enable_thinking": False}`` or ``{"reasoning_effort": "low"}``.
        ``response_format`` and ``grammar`` constrain the reply's content (see
        :mod:`elelem.api.structured`).  ``logprobs=True`` adds OpenAI's
        ``choices[0]["logprobs"]["content"]``, with the ``top_logprobs``
        (0..20) likeliest tokens of each step.  ``chat_template_kwargs``: more
        variables for the chat template (``{"enable_thinking": False}``; see ``chat_stream``).
        """
        with self._lock:
            plan = plan_tools(tools, tool_choice, self.assets.chat_template.source,
                              self._tool_call_format(tool_call_format), parallel_tool_calls)
            output = output_grammar(response_format, grammar)
            n_top = chat_logprobs_count(logprobs, top_logprobs)
            if n_top is not None and plan.parses_calls:
                raise InvalidArgumentError("logprobs are not available for replies parsed into tool calls")
            if n_top is not None:
                sampling = {**sampling, "logprobs": n_top}
            text = self._chat_text_stream(messages, plan, _unlimited_if_not_positive(max_tokens), stop, sampling,
                                          output, chat_template_kwargs=chat_template_kwargs,
                                          reasoning_format=reasoning_format, tool_call_format=tool_call_format)
            name = model if model is not None else self.assets.model_name
            if stream:
                return completions.chat_completion_chunks(text, name)
            return completions.chat_completion(text, name)

    # -- shared ----------------------------------------------------------------

    def _tool_call_format(self, tool_call_format: Optional[str]) -> Optional[str]:
        # A call's own, else the LLM's (LLM(tool_call_format=...)), else None: read from the template.
        return tool_call_format if tool_call_format is not None else self.assets.tool_call_format

    def _chat_text_stream(self, messages: Messages, plan: ToolPlan, max_tokens: Optional[int],
                          stop: StopArg, sampling: dict, output: Optional[Grammar], *,
                          chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                          reasoning_format: Optional[str] = None,
                          tool_call_format: Optional[str] = None) -> TextStream:
        if output is not None and plan.template_tools is not None:
            # A constrained reply could hold no tool call, and a call would break the format.
            raise GrammarError(f"{output.param} cannot be combined with tools, unless tool_choice is 'none'",
                               param=output.param)
        variables = template_kwargs(chat_template_kwargs)
        extracts_reasoning(reasoning_format)  # a bad value fails before any compute
        source = self.assets.chat_template.source
        template_format = parser_for(source, self._tool_call_format(tool_call_format))
        fmt = plan.parser
        if fmt is None:  # no calls to read; a format may still carry the reasoning (gpt-oss's)
            fmt = template_format if template_format.handles_reasoning else None
        # Templates that print an earlier turn's reasoning as message.thinking (gpt-oss's, LFM2.5's) get
        # reasoning_content under that name too, as llama.cpp's handlers for them give it.
        messages = reasoning_messages(messages, thinking_key=template_format.reasoning_as_thinking)
        images_in = self.assets.images
        images = []
        if images_in is not None:
            messages, images = images_in.marked_messages(messages)
        prompt, ids = chat_prompt(self.assets, messages_for_template(messages), tools=plan.template_tools,
                                  **variables)
        if images:
            ids = images_in.model_prompt_ids(self.assets, prompt, images)
        reply = reply_parser(fmt, source, prompt, parse_calls=plan.parses_calls, tools=plan.functions,
                             reasoning_format=reasoning_format)
        constraint: Union[LazyConstraint, TokenConstraint, None]
        if output is None:
            constraint = plan.constraint(self.assets, reply.reasoning_span() if reply is not None else None)
        else:
            constraint = output_constraint(self.assets, output)
        preserved: frozenset[int] = frozenset()
        if reply is not None and reply.preserved_tokens:
            control = tool_vocabulary(self.assets).control
            preserved = frozenset(control[t] for t in reply.preserved_tokens if t in control)
        stream = self._text_stream(ids, max_tokens, stop, sampling, CHAT_DEFAULTS, constraint, preserved=preserved)
        stream.reply = reply
        return stream

    def _text_stream(self, ids: list[int], max_tokens: Optional[int], stop: StopArg,
                     sampling: dict, defaults: Mapping[str, Any], constraint=None,
                     preserved: frozenset = frozenset()) -> TextStream:
        sampling = dict(sampling)
        speculative = sampling.pop("speculative", None)
        logprobs = sampling.pop("logprobs", None)
        lora = sampling.pop("lora", None)
        if logprobs is not None and speculative is None:
            # Verified drafts come from batched steps, whose logits differ from one-token
            # steps by rounding (up to ~0.1 in a logprob on SmolLM2): decode token by token
            # so the values are llama.cpp's, unless speculation is asked for explicitly.
            speculative = False
        unknown = sorted(set(sampling) - SAMPLING_NAMES)
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}; "
                            f"the sampling parameters are {', '.join(sorted(SAMPLING_NAMES))}")
        params = SamplingParams(**{**defaults, **sampling})
        budget = token_budget(len(ids), max_tokens, self.n_ctx)
        return self._open_stream(ids, params, budget, normalize_stop(stop), constraint, speculative=speculative,
                                 logprobs=logprobs, preserved=preserved, lora=lora)


def _unlimited_if_not_positive(max_tokens: Optional[int]) -> Optional[int]:
    # llama-cpp-python's rule for its create_* methods.
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens <= 0:
        return None
    return max_tokens
