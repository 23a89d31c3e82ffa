"""One generation request as an ASGI response: a worker thread drives the library, the event loop answers.

The worker thread holds the request's session from start to end, because
a session's stream must be read by the thread that started it.  It hands
each result to the event loop through a zero-buffer channel, so it never
runs ahead of the client by more than the engine's own few tokens.

The first result decides the answer: an error before any output is a JSON
error with its status; a whole response is JSON; a first event starts the
SSE stream.  The request's :class:`~.wire.Wire` writes each of them in its
API's shapes (Chat Completions': ``data: {json}`` events, then ``data: [DONE]``,
and an error after the stream started as one ``data: {"error": ...}`` event).

When the client disconnects, or the server stops the request (shutdown),
the session is cancelled: the generation stops within one engine step,
then the worker closes the session, freeing its cells, before the
response returns.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator
from typing import Any, Callable, Optional

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.responses import JSONResponse

from .call import Answer, Call, start
from .errors import APIError, from_exception
from .metrics import Metrics
from .registry import ServedModel
from .wire import Wire

log = logging.getLogger("elelem.server")

# What the worker hands the event loop: a kind ("event", "whole", "end", "error", "cancelled") and its value.
_Result = tuple[str, Any]

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


class _ClientGone(Exception):
    """The event loop side stopped listening: stop producing."""


class Generation:
    """One accepted request (its slot already reserved), answered when called as an ASGI app."""

    def __init__(self, endpoint: str, model: ServedModel, call: Call, wire: Wire, metrics: Metrics,
                 limiter: anyio.CapacityLimiter, retry_after: int, live: set):
        self.endpoint = endpoint
        self.wire = wire
        self.model = model
        self.call = call
        self.metrics = metrics
        self.limiter = limiter
        self.retry_after = retry_after
        self._live = live  # the server's running generations, for cancel-all at shutdown
        self.status = 200
        self.accepted = time.perf_counter()
        self._session: Any = None  # the session the registry lent this request, while it runs
        self._session_lock = threading.Lock()
        self._cancelled = False
        self._started = False
        self._responded = False   # the last byte of the response was sent
        self._answer: Optional[Answer] = None

    # -- the event loop side -----------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        self.metrics.queued(+1)
        self._live.add(self)
        to_loop: MemoryObjectSendStream[_Result]
        from_worker: MemoryObjectReceiveStream[_Result]
        to_loop, from_worker = anyio.create_memory_object_stream(0)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch_disconnect, receive)
                group.start_soon(self._run_worker, to_loop)
                try:
                    async with from_worker:
                        await self._respond(from_worker, scope, receive, send)
                finally:
                    self.cancel()  # a no-op after a normal end; else stops the worker's compute
                    group.cancel_scope.cancel()  # the worker's thread is still awaited to its end
        finally:
            self._live.discard(self)
            self.model.release()
            self.metrics.stopped() if self._started else self.metrics.queued(-1)
            self.metrics.request_done(self.endpoint, self.status)
            self._log_end()

    def _log_end(self) -> None:
        answer = self._answer
        text = answer.text if answer is not None else None
        prompt, completion = (text.prompt_tokens, text.completion_tokens) if text is not None else (0, 0)
        self.metrics.tokens(prompt, completion, text.reused_tokens if text is not None else 0)
        log.info("POST %s -> %d (%.0f ms, %s, %d prompt + %d completion tokens)", self.endpoint, self.status,
                 (time.perf_counter() - self.accepted) * 1000, self.model.id, prompt, completion)

    def cancel(self) -> None:
        """Stop the generation (from any thread); the worker then ends the request."""
        with self._session_lock:  # never a session already given back to the pool for another request
            self._cancelled = True
            if self._session is not None and not self._finished():
                self._session.cancel()

    async def _watch_disconnect(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if self._responded:  # the server reports the end of every finished response as a disconnect
            return
        log.info("%s: the client disconnected; cancelling its generation", self.endpoint)
        self.status = 499  # nginx's 'client closed request', for the logs and metrics
        self.cancel()

    async def _run_worker(self, to_loop: MemoryObjectSendStream[_Result]) -> None:
        async with to_loop:
            await anyio.to_thread.run_sync(self._work, to_loop, limiter=self.limiter)

    async def _respond(self, results: MemoryObjectReceiveStream[_Result], scope, receive, send) -> None:
        kind, value = await results.receive()
        if kind != "event":
            if kind == "cancelled":
                if self.status == 499:
                    return  # nobody to answer
                value = _shutting_down(self.retry_after)
            response = self.wire.error_response(from_exception(value, self.retry_after)) if kind == "error" or \
                kind == "cancelled" else JSONResponse(value)
            self.status = response.status_code
            self._responded = True  # nothing is left to cancel
            await response(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        while kind == "event":
            await send({"type": "http.response.body", "body": value, "more_body": True})
            kind, value = await results.receive()
        if kind == "error" or (kind == "cancelled" and self.status != 499):
            error = value if kind == "error" else _shutting_down(self.retry_after)
            await send({"type": "http.response.body", "body": self.wire.error_event(from_exception(error)),
                        "more_body": True})
        self._responded = True  # before the send: the disconnect it causes is no cancel
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- the worker thread side --------------------------------------------------

    def _work(self, to_loop: MemoryObjectSendStream[_Result]) -> None:
        def put(kind: str, value: Any = None) -> None:
            try:
                anyio.from_thread.run(to_loop.send, (kind, value))
            except Exception as error:  # the receiver closed, or the loop is gone
                raise _ClientGone() from error

        try:
            self._generate(put)
        except _ClientGone:
            pass
        except KeyboardInterrupt:  # session.cancel(): the client left or the server is stopping
            self._try(put, "cancelled")
        except BaseException as error:  # noqa: B902 -- every failure becomes a response
            self._try(put, "error", error)

    def _generate(self, put) -> None:
        with self.model.session() as session:
            with self._session_lock:
                self._session = session
            try:
                self._generate_on(session, put)
            finally:
                with self._session_lock:
                    self._session = None

    def _generate_on(self, session, put) -> None:
        if self._cancelled:
            raise KeyboardInterrupt("cancelled before it started")
        answer = self._answer = start(session, self.call, self.model.id)
        if self._cancelled:  # while it was tokenizing: its stream was not running yet to be cancelled
            raise KeyboardInterrupt("cancelled before it started")
        self.wire.started(answer)
        if not self.call.stream:
            response = answer.whole()
            self._first_output()
            put("whole", self.wire.whole(response, answer.usage()))  # the library's usage, with the drafts
            return
        chunks = answer.chunks()
        # The chunk builders are generator functions: closing one early ends its stream (below).
        assert isinstance(chunks, Generator)
        try:
            last = time.perf_counter()
            for chunk in chunks:
                if not _announces_role(chunk):  # that one comes before any compute
                    now = time.perf_counter()
                    if self._started:
                        self.metrics.interval(now - last)
                    else:
                        self._first_output()
                    last = now
                for event in self.wire.events(chunk):
                    put("event", event)
            for event in self.wire.end(answer.usage()):
                put("event", event)
            put("end")
        finally:
            chunks.close()  # in this thread: the stream's lock is this thread's

    def _first_output(self) -> None:
        self._started = True
        self.metrics.started(time.perf_counter() - self.accepted)

    def _finished(self) -> bool:
        answer = self._answer
        return answer is not None and answer.text.finish_reason is not None

    @staticmethod
    def _try(put, kind: str, value: Any = None) -> None:
        try:
            put(kind, value)
        except _ClientGone:
            pass


async def accept(state, request, call: Call, wire: Callable[[str], Wire]) -> Generation:
    """The generation of a checked call, once its model has a slot for it: ``state`` is the app's
    :class:`~.app.ServerState`; ``wire(model_id)`` makes the protocol's wire for the answer."""
    model = state.registry.get(call.model)
    await model.reserve()  # may wait in the queue; 503 with Retry-After past its bounds
    return Generation(request.url.path, model, call, wire(model.id), state.metrics, state.limiter,
                      state.config.retry_after_seconds, live=state.generations)


def _announces_role(chunk: dict) -> bool:
    choices = chunk.get("choices")
    if not choices:
        return False
    return choices[0].get("delta") == {"role": "assistant"}


def _shutting_down(retry_after: int) -> APIError:
    return APIError(503, "the request was cancelled: the server is shutting down", type="server_overloaded",
                    retry_after=retry_after)

