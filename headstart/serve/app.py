"""The HTTP side of `headstart serve` (FastAPI): OpenAI's chat and text completions (replies.py),
the model list and card, vLLM's tokenizer endpoints (tokens.py: lm-evaluation-harness finds the
server's tokenizer there), health and metrics.

Every refusal is an OpenAI error body (`{"error": {"message", "type", "param", "code"}}`) with its
status, unknown paths (404) and methods (405) included, and one log line: 400 a bad field, 401 a
wrong key, 404 an unknown model or path, 413 too long for the context, 415 a body not sent as
JSON, 429 the queue is full, 503 shutting down. Fields headstart does not know are ignored, as
vLLM ignores them: one warning line per request and a count per field in /metrics."""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from headstart.errors import printable
from headstart.serve import protocol
from headstart.serve.bodies import Refused
from headstart.serve.chat import chat_prompt, utf8
from headstart.serve.limits import BodyLimit
from headstart.serve.replies import Asked, respond
from headstart.serve.served import Served
from headstart.serve.tokens import TOKENIZER_PATHS, add_tokenizer_routes, check_ids

log = logging.getLogger("headstart.serve")
POSTS = ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize")
UNION_TAGS = {"str", "int", "float", "bool"}  # pydantic's names for a union's members in an error's loc
ROUTES = "/v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize, /tokenizer_info, /health, /metrics"
KNOWN = frozenset(ROUTES.split(", "))


def metric_label(path: str) -> str:
    """A request's path as a /metrics label: one of the server's routes, or a bounded stand-in (a
    client's path as a label would let any caller add series without end)."""
    if path in KNOWN:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "unknown"


def build_app(served: Served) -> FastAPI:
    """The OpenAI-compatible app: refusals in OpenAI's shape, the key and body guards, the model
    and health routes, the completion routes, the tokenizer's."""
    app = FastAPI(title="headstart serve", docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(endpoint: str, err: Refused, headers: dict[str, str] | None = None) -> JSONResponse:
        served.metrics.request(metric_label(endpoint), err.status)
        log.warning("%d %s: %s", err.status, endpoint, printable(err.message))
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    def check_model(name: str) -> None:
        if name != served.model:
            raise Refused(404, f"model '{name}' is not served here (it serves '{served.model}')", "model",
                          "model_not_found")  # fmt: skip

    crashed = _add_error_handlers(app, refuse)
    _add_guards(app, served, refuse, crashed)
    _add_info_routes(app, served, refuse, check_model)
    _add_completion_routes(app, served, refuse, check_model)
    add_tokenizer_routes(app, served, refuse, check_model)
    return app


def _add_error_handlers(app: FastAPI, refuse: Any) -> Any:
    """Validation errors, unknown paths (404) and methods (405), and bugs (500) answered as
    OpenAI errors; returns the 500 handler (the guard answers a bug inside CORS with it)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return refuse(request.url.path, validation_refusal(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        path, method = request.url.path, request.method
        if exc.status_code == 404:
            err = Refused(404, f"no endpoint {path!r}: this server answers {ROUTES}", code="not_found")
            return refuse("unknown", err)  # a path as a metric label would let clients add series
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "another method")
            return refuse(path, Refused(405, f"{method} is not allowed on {path}: use {allowed}",
                                        code="method_not_allowed"), exc.headers)  # fmt: skip
        return refuse(path, Refused(exc.status_code, str(exc.detail)), exc.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        """A bug: a 500 in OpenAI's shape (Starlette's own is a text/plain line), its traceback logged."""
        log.error("500 %s", request.url.path, exc_info=exc)
        return refuse(request.url.path, Refused(500, f"internal error: {type(exc).__name__}: {exc}"))

    return crashed


def _add_guards(app: FastAPI, served: Served, refuse: Any, crashed: Any) -> None:
    """The middleware, innermost first: the API key and the JSON content type, the body's size
    and arrival time, then CORS (outermost, so preflights and refusals get its headers)."""

    def check_key(request: Request) -> None:
        if served.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        # the scheme is case-insensitive (RFC 9110 11.1); the key is compared in constant time
        right = hmac.compare_digest(given.strip().encode(), served.api_key.encode())
        if scheme.lower() != "bearer" or not right:
            raise Refused(401, "missing or wrong API key (Authorization: Bearer KEY)")

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        """The key before anything else of a /v1 request: a caller without it learns nothing,
        not even what its body got wrong (FastAPI validates the body before a handler runs);
        then a body that is not JSON, in one line (FastAPI's own error names a dict it could
        not read)."""
        path = request.url.path
        try:
            if path.startswith("/v1/") or path in TOKENIZER_PATHS:
                check_key(request)
            if request.method == "POST" and path in POSTS:
                given = request.headers.get("content-type", "")
                if given.split(";")[0].strip().lower() != "application/json":
                    raise Refused(415, f"send the body as JSON with the header 'Content-Type: application/json' "
                                  f"(got {given or 'no Content-Type'!r})", code="unsupported_media_type")  # fmt: skip
        except Refused as err:
            return refuse(path, err)
        try:
            return await call_next(request)
        except ClientDisconnect:  # the client left (or its body came too late: BodyLimit answered 408)
            return Response(status_code=499)  # nobody reads it
        except Exception as exc:  # noqa: BLE001 - a bug: answered here, inside CORS, so a browser reads it
            return await crashed(request, exc)

    def refused_body(path: str, status: int = 413) -> None:
        served.metrics.request(path if path in POSTS else "unknown", status)
        if status == 408:
            log.warning(
                "408 %s: the request body did not arrive within %g s", printable(path), served.body_timeout
            )
        else:
            log.warning("413 %s: the request body is larger than %d bytes", printable(path), served.max_body)

    app.add_middleware(
        BodyLimit, limit=served.max_body, count=refused_body, timeout=served.body_timeout
    )  # fmt: skip  (before any body is read)
    if served.allowed_origins:  # added last: outermost, so preflights and refusals get CORS headers
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(served.allowed_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"], max_age=600)  # fmt: skip


def _add_info_routes(app: FastAPI, served: Served, refuse: Any, check_model: Any) -> None:
    """/health, /metrics, /v1/models and the model's card."""
    started = int(time.time())

    @app.get("/health")
    async def health() -> JSONResponse:
        if served.scheduler.closing:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(served.metrics.text(), media_type="text/plain; version=0.0.4")

    def card() -> dict[str, Any]:
        return {"id": served.model, "object": "model", "created": started, "owned_by": "headstart",
                "max_model_len": served.context}  # fmt: skip

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card()]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> JSONResponse:
        try:
            check_model(model)
        except Refused as err:
            return refuse("/v1/models/{id}", err)
        return JSONResponse(card())


def _add_completion_routes(app: FastAPI, served: Served, refuse: Any, check_model: Any) -> None:
    """OpenAI's chat and text completions (replies.py answers both)."""

    def note_ignored(endpoint: str, body: Any) -> None:
        names = protocol.ignored_fields(body)
        if names:
            served.metrics.ignored(names)
            shown = ", ".join(names[:16]) + (f" and {len(names) - 16} more" if len(names) > 16 else "")
            log.warning("%s: ignored fields headstart does not know: %s", endpoint, printable(shown))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: protocol.ChatRequest, request: Request) -> Any:
        endpoint = "/v1/chat/completions"
        try:
            note_ignored(endpoint, body)
            check_model(body.model)
            prompt = chat_prompt(served.target.chat, body)
            asked = Asked(endpoint, True, [prompt], body.limit(), [""], body.top(), "messages")
            return await respond(served, body, asked, request)
        except Refused as err:
            return refuse(endpoint, err)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: protocol.CompletionRequest, request: Request) -> Any:
        endpoint = "/v1/completions"
        try:
            note_ignored(endpoint, body)
            check_model(body.model)
            prompts, texts = [], []
            for prompt in body.prompts():
                ids = served.target.chat.encode_raw(utf8(prompt, "prompt")) if isinstance(prompt, str) \
                    else check_ids(served.target, prompt, "prompt")  # fmt: skip
                if not ids:
                    raise Refused(400, "prompt is empty", "prompt")
                prompts.append(ids)
                texts.append(prompt if isinstance(prompt, str) else served.target.tokenizer.decode(ids))
            echoes = texts if body.echo else [""] * len(texts)
            asked = Asked(endpoint, False, prompts, body.limit(), echoes, body.top(), "prompt", body.echo)
            return await respond(served, body, asked, request)
        except Refused as err:
            return refuse(endpoint, err)


def validation_refusal(exc: RequestValidationError) -> Refused:
    """FastAPI's first validation error as one line naming the field."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return Refused(400, "the request body is not valid JSON")
    if loc[:1] == ["prompt"] and first.get("type") != "value_error":  # a union: its first member's error
        return Refused(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                       f"lists of token ids ({first.get('msg', 'invalid value')})", "prompt")  # fmt: skip
    where = (
        ".".join(p for p in loc if p not in UNION_TAGS and not p.startswith(("function-", "list[", "dict[")))
        or None
    )
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return Refused(400, f"{where}: {message}" if where else message, where)
