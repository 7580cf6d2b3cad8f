"""The HTTP side of `headstart serve` (FastAPI): OpenAI's chat and text completions (streamed as
server-sent events in OpenAI's chunk format, usage last), the model list, health and metrics.
Every refusal is an OpenAI error body with its status (400 a bad field, 401 a wrong key, 404 an
unknown model, 413 too long for the context, 429 the queue is full, 503 shutting down) and one
log line."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from headstart.errors import HeadstartError
from headstart.inference.engine import Job
from headstart.inference.plain import MIN_TEMPERATURE
from headstart.inference.stops import StopRule
from headstart.serve import protocol
from headstart.serve.metrics import Metrics
from headstart.serve.scheduler import Closing, QueueFull, Scheduler, Ticket
from headstart.serve.text import TextStream

log = logging.getLogger("headstart.serve")


@dataclass
class Served:
    """What the handlers share: the target (tokenizer, chat template), the decode loop, limits."""

    target: Any
    scheduler: Scheduler
    metrics: Metrics
    model: str  # the id clients name (`--served-model-name`, default the --target given)
    context: int  # the target's context: prompt + max_tokens must fit
    max_tokens: int  # the most tokens a request may ask for
    default_tokens: int  # a chat request that names no max_tokens gets this many at most
    api_key: str | None = None
    mode: str = "plain decoding"


class Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def build_app(served: Served) -> FastAPI:
    app = FastAPI(title="headstart serve", docs_url=None, redoc_url=None)

    def refuse(endpoint: str, err: Refused) -> JSONResponse:
        served.metrics.request(endpoint, err.status)
        log.warning("%d %s: %s", err.status, endpoint, err.message)
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
                503: "service_unavailable"}.get(err.status, "invalid_request_error")  # fmt: skip
        kind = "server_error" if err.status >= 500 and err.status != 503 else kind
        return JSONResponse(
            protocol.error_body(err.message, kind, err.param, err.code), status_code=err.status
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        if first.get("type") == "json_invalid":
            message, where = "the request body is not valid JSON", None
        elif first.get("type") == "extra_forbidden":
            message = f"unknown field '{where}'"
        else:
            message = (
                f"{where}: {first.get('msg', 'invalid value')}"
                if where
                else first.get("msg", "invalid request")
            )
        return refuse(request.url.path, Refused(400, message, where))

    def check_key(request: Request) -> None:
        if served.api_key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {served.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):  # constant time
            raise Refused(401, "missing or wrong API key (Authorization: Bearer KEY)")

    @app.middleware("http")
    async def key_first(request: Request, call_next: Any) -> Any:
        """The key before anything else of a /v1 request: a caller without it learns nothing,
        not even what its body got wrong (FastAPI validates the body before a handler runs)."""
        if request.url.path.startswith("/v1/"):
            try:
                check_key(request)
            except Refused as err:
                return refuse(request.url.path, err)
        return await call_next(request)

    @app.get("/health")
    async def health() -> JSONResponse:
        if served.scheduler.closing:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(served.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        card = {"id": served.model, "object": "model", "created": int(time.time()), "owned_by": "headstart"}
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: protocol.ChatRequest, request: Request) -> Any:
        endpoint = "/v1/chat/completions"
        try:
            check_model(body.model)
            messages = [{"role": "system" if m.role == "developer" else m.role, "content": utf8(m.text(), "messages")}
                        for m in body.messages]  # fmt: skip
            try:
                prompt = served.target.chat.prompt_ids(messages)
            except HeadstartError as err:
                raise Refused(400, err.what, "messages") from None
            return await answer(endpoint, body, prompt, body.limit(), chat=True, request=request)
        except Refused as err:
            return refuse(endpoint, err)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: protocol.CompletionRequest, request: Request) -> Any:
        endpoint = "/v1/completions"
        try:
            check_model(body.model)
            if not body.text():
                raise Refused(400, "prompt is empty", "prompt")
            prompt = served.target.chat.encode_raw(utf8(body.text(), "prompt"))
            return await answer(endpoint, body, prompt, body.limit(), chat=False, request=request)
        except Refused as err:
            return refuse(endpoint, err)

    def utf8(text: str, where: str) -> str:
        """JSON can carry a lone surrogate ("\\ud800"), which no tokenizer takes: a 400, not a 500."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise Refused(400, f"{where} is not valid Unicode text ({err.reason} at character {err.start})",
                          where) from None  # fmt: skip
        return text

    def check_model(name: str) -> None:
        if name != served.model:
            raise Refused(404, f"model '{name}' is not served here (it serves '{served.model}')", "model",
                          "model_not_found")  # fmt: skip

    async def answer(endpoint: str, body: protocol.Sampling, prompt: list[int], asked: int | None, chat: bool,
                     request: Request) -> Any:  # fmt: skip
        where = "messages" if chat else "prompt"
        if len(prompt) >= served.context:
            raise Refused(413, f"prompt of {len(prompt)} tokens leaves no room in the context of {served.context}",
                          where, "context_length_exceeded")  # fmt: skip
        # a request that names no max_tokens gets the default, within this server's own limit
        limit = (
            asked
            if asked is not None
            else min(served.default_tokens, served.max_tokens, served.context - len(prompt))
        )
        if limit > served.max_tokens:
            raise Refused(
                400, f"max_tokens {limit} exceeds this server's limit of {served.max_tokens}", "max_tokens"
            )
        if len(prompt) + limit > served.context:
            raise Refused(413, f"prompt of {len(prompt)} tokens + max_tokens {limit} exceeds the context of "
                          f"{served.context}", where, "context_length_exceeded")  # fmt: skip
        target = served.target
        stops = body.stop_strings()
        rule = StopRule(limit, frozenset(target.eos_token_ids), stops, target.tokenizer)
        job = Job(
            key=protocol.new_id("chatcmpl" if chat else "cmpl"), prompt=prompt, rule=rule, seed=body.seed
        )
        # below MIN_TEMPERATURE the logits would overflow: greedy, as vLLM does
        sampled = body.temperature >= MIN_TEMPERATURE
        warp = (body.temperature, body.top_p, body.top_k) if sampled else (0.0, 1.0, 0)
        ticket = Ticket(job, warp, asyncio.get_running_loop())
        job.on_tokens = lambda tokens: ticket.post("tokens", tokens)
        try:
            served.scheduler.submit(ticket)
        except QueueFull:
            raise Refused(429, "too many requests waiting; retry later") from None
        except Closing:
            raise Refused(503, "the server is shutting down") from None
        started = time.perf_counter()
        stream = TextStream(target.tokenizer, stops)
        if body.stream:
            served.metrics.request(endpoint, 200)
            events = sse(job, ticket, stream, chat, len(prompt), started)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            finish = await drain_unless_gone(ticket, stream, request)
        finally:
            if job.finish is None:  # a client that went away (or an error) frees its row at once
                job.cancelled = True
                with served.scheduler.wake:
                    served.scheduler.wake.notify()
        if finish is None:
            served.metrics.request(endpoint, 499)  # nginx's "client closed request": nobody reads this
            log.info("%s: the client went away; its row is freed", endpoint)
            return JSONResponse(
                protocol.error_body("the client closed the request", "invalid_request_error"), 499
            )
        text = stream.text  # all of it: `push` released parts of it as it came
        reason = "stop" if stream.stopped or finish == "stop" else "length"
        served.metrics.served(
            len(prompt), len(job.emitted), time.perf_counter() - started, _first(job, started)
        )
        served.metrics.request(endpoint, 200)
        build = protocol.chat_response if chat else protocol.completion_response
        return JSONResponse(build(job.key, served.model, text, reason, len(prompt), len(job.emitted)))

    def failure(err: Exception) -> tuple[int, str]:
        """The status and message of a request the decode loop failed."""
        if isinstance(err, Closing):
            return 503, str(err)
        return 500, f"generation failed: {str(err) or type(err).__name__}"

    async def drain_unless_gone(ticket: Ticket, stream: TextStream, request: Request) -> str | None:
        """The finish reason, or None when the client went away first. Starlette cancels a
        streamed response whose client leaves, but not a plain one: without this race its row
        would decode to max_tokens for nobody."""
        drained = asyncio.ensure_future(drain(ticket, stream))
        gone = asyncio.ensure_future(disconnected(request))
        try:
            done, _ = await asyncio.wait({drained, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (drained, gone):
                task.cancel()
        return drained.result() if drained in done else None

    async def disconnected(request: Request) -> None:
        """Returns when the client disconnects (the body is read: receive() waits for that)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def drain(ticket: Ticket, stream: TextStream) -> str:
        while True:
            kind, value = await ticket.events.get()
            if kind == "tokens":
                stream.push(value)
            elif kind == "done":
                return value
            else:
                raise Refused(*failure(value))

    async def sse(job: Job, ticket: Ticket, stream: TextStream, chat: bool, prompt: int,
                  started: float) -> AsyncIterator[str]:  # fmt: skip
        def event(data: dict[str, Any]) -> str:
            return f"data: {json.dumps(data)}\n\n"

        finish = None
        try:
            if chat:
                yield event(protocol.chunk(job.key, served.model, chat, role=True))
            while finish is None:
                kind, value = await ticket.events.get()
                if kind == "tokens":
                    text = stream.push(value)
                    if text:
                        yield event(protocol.chunk(job.key, served.model, chat, text=text))
                elif kind == "done":
                    finish = value
                else:
                    yield event(protocol.error_body(failure(value)[1], "server_error"))
                    return
            rest = stream.finish()
            reason = "stop" if stream.stopped or finish == "stop" else "length"
            yield event(protocol.chunk(job.key, served.model, chat, text=rest or None, finish=reason))
            yield event(
                protocol.chunk(job.key, served.model, chat, use=protocol.usage(prompt, len(job.emitted)))
            )
            yield "data: [DONE]\n\n"
            served.metrics.served(
                prompt, len(job.emitted), time.perf_counter() - started, _first(job, started)
            )
        finally:  # the client went away mid-stream (the generator is closed): its row leaves at once
            if job.finish is None:
                job.cancelled = True
                with served.scheduler.wake:
                    served.scheduler.wake.notify()

    return app


def _first(job: Job, started: float) -> float | None:
    return None if job.first_token_s is None else max(0.0, job.first_token_s - started)
