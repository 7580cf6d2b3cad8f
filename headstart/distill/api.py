"""`--engine openai`: replies from any OpenAI-compatible chat-completions server (vLLM, SGLang,
TGI, llama.cpp's server, `transformers serve`), for targets too big to run in this process.

Up to `concurrency` requests are in flight; each is retried with exponential backoff (honouring
Retry-After) on connection errors, timeouts, 429 and 5xx; any other HTTP error stops the run in one
line. Replies come back as text: they are tokenized with the target's tokenizer and rendered with
its chat template like every other record (the `retokenized` count of the summary says how many
differ from the server's own ids, which the API does not return). Records go through the same
resumable shards as the other engines, so an interrupted run resumes without duplicates or gaps.
The target's weights are not loaded for this engine (unless features are cached).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from headstart.errors import HeadstartError
from headstart.inference.requests import EngineStats, Reply, Request

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # e.g. http://localhost:8000/v1
    model: str
    api_key: str | None = None
    concurrency: int = 8
    max_retries: int = 5
    timeout_s: float = 600.0

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


class DaemonPool:
    """`workers` threads calling one function per submitted argument, as daemons: an interrupted
    or failed run exits at once. A ThreadPoolExecutor's threads are joined at exit, and each may be
    inside a request that takes up to timeout_s (600 s) times its retries."""

    def __init__(self, workers: int, name: str) -> None:
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.workers = workers
        for number in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{number}", daemon=True).start()

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        future: Future = Future()
        self.jobs.put((future, fn, arg))
        return future

    def shutdown(self) -> None:
        for _ in range(self.workers):
            self.jobs.put(None)  # each worker ends after the request it is in

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, fn, arg = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(arg))
            except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(err)


class OpenAIEngine:
    """Chat completions over HTTP, `concurrency` at a time; replies handed back in this thread."""

    name = "openai"

    def __init__(
        self, tokenizer: Any, endpoint: Endpoint, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.tokenizer = tokenizer
        self.endpoint = endpoint
        self.sleep = sleep
        key = endpoint.api_key or os.environ.get("OPENAI_API_KEY")
        self.headers = {
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {key}"} if key else {}),
        }
        self.stats = EngineStats()
        self.empty = 0
        """Replies with no text: counted and said once at the end (a template or max_tokens issue)."""

    def run(self, requests: Iterable[Request], on_reply: Callable[[Request, Reply], Any]) -> EngineStats:
        source, follow = iter(requests), deque[Request]()
        pending: dict[Future[Reply], Request] = {}
        pool = DaemonPool(self.endpoint.concurrency, "headstart-api")
        start = time.perf_counter()
        try:
            while True:
                while len(pending) < self.endpoint.concurrency:
                    nxt = follow.popleft() if follow else next(source, None)
                    if nxt is None:
                        break
                    pending[pool.submit(self.complete, nxt)] = nxt
                if not pending:
                    return self.stats
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    request = pending.pop(future)
                    reply = future.result()  # a HeadstartError after the retries stops the run
                    self.stats.replies += 1
                    self.stats.new_tokens += len(reply.token_ids) + int(reply.finished)
                    self.stats.prompt_tokens += len(request.prompt)
                    follow.extend(on_reply(request, reply) or [])
        finally:
            self.stats.decode_s += time.perf_counter() - start
            for future in pending:
                future.cancel()  # not started yet: never sent
            pool.shutdown()
            if self.empty:
                logging.getLogger(__name__).warning(
                    "warning: %d of %d replies from %s were empty (no text): the server's model may need "
                    "another chat template, a larger max_tokens, or reasoning turned off; such records "
                    "teach the head nothing",
                    self.empty,
                    self.stats.replies,
                    self.endpoint.url,
                )

    def complete(self, request: Request) -> Reply:
        """One chat completion -> Reply (ids by the target's tokenizer; finished = the model stopped)."""
        if request.messages is None:
            raise HeadstartError("the openai engine needs requests with messages", "use the distill pipeline")
        sampling = request.sampling
        payload: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": request.messages,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": request.seed,
        }
        if sampling.top_k:
            payload["top_k"] = sampling.top_k  # vLLM, SGLang and llama.cpp take it as an extra field
        body = self._post(payload)
        try:
            choice = body["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise HeadstartError(
                f"{self.endpoint.url} answered without choices[0].message.content: {str(body)[:200]}",
                "point --base-url at an OpenAI-compatible /v1 endpoint",
            ) from None
        if not text.strip():
            self.empty += 1  # one worker thread at a time per reply; a lost count would only be cosmetic
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Reply(ids, finished=choice.get("finish_reason") == "stop")

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with retries (stdlib urllib: one request per call, no extra dependency)."""
        url, tries = self.endpoint.url, self.endpoint.max_retries + 1
        data = json.dumps(payload).encode()
        problem = ""
        for attempt in range(tries):
            try:
                call = urllib.request.Request(url, data=data, headers=self.headers, method="POST")
                with urllib.request.urlopen(call, timeout=self.endpoint.timeout_s) as response:
                    body = response.read()
                    kind = response.headers.get("Content-Type", "")
                if "html" in kind or body.lstrip()[:1] == b"<":  # a web page, not an API: no retry mends it
                    raise HeadstartError(
                        f"{url} answered with a web page, not JSON ({html_title(body)})",
                        "point --base-url at the API root of an OpenAI-compatible server, usually ending in /v1",
                    )
                return json.loads(body)
            except urllib.error.HTTPError as err:
                problem = f"HTTP {err.code} {err.reason}: {error_summary(err)}"
                if err.code not in RETRY_STATUS:
                    raise HeadstartError(f"{url} refused the request ({problem})", HTTP_FIXES.get(
                        err.code, "check --base-url, --model and the server's log")) from None  # fmt: skip
                wait_s = _retry_after(err.headers) or 2.0**attempt
            except (urllib.error.URLError, OSError, ValueError) as err:  # refused, reset, timed out, cut
                problem = f"{type(err).__name__}: {err}"
                wait_s = 2.0**attempt
            if attempt + 1 < tries:
                self.sleep(min(wait_s, 60.0))
        raise HeadstartError(
            f"{url} failed {tries} times ({problem})",
            "start the server, fix --base-url, or raise max_retries; rerun the same command to resume",
        )


HTTP_FIXES = {
    400: "check the sampling settings the server accepts (--temperature, --top-p, --top-k) and its log",
    401: "pass the server's key with api_key=... or OPENAI_API_KEY",
    403: "pass a key the server accepts with api_key=... or OPENAI_API_KEY",
    404: "check --base-url (the API root, usually ending in /v1) and --model (the name the server serves)",
    405: "--base-url does not serve /chat/completions: point it at the API root, usually ending in /v1",
    501: "--base-url does not serve /chat/completions: point it at the API root, usually ending in /v1",
}


def html_title(body: bytes) -> str:
    """A web page's title (or its first words), for one line."""
    import html
    import re

    text = body[:4096].decode(errors="replace")
    title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
    words = " ".join(html.unescape(title.group(1) if title else re.sub(r"<[^>]+>", " ", text)).split())
    return f"'{words[:80]}'" if words else "an empty page"


def error_summary(err: urllib.error.HTTPError, limit: int = 160) -> str:
    """One line from an error response: an OpenAI error JSON's message, an HTML page's title (or
    its text without tags), else the start of the body."""
    import html
    import re

    body = err.read()[:4096].decode(errors="replace")
    try:
        data = json.loads(body)
        message = data.get("error", data) if isinstance(data, dict) else data
        message = message.get("message", message) if isinstance(message, dict) else message
        text = str(message)
    except ValueError:
        title = re.search(r"<title[^>]*>(.*?)</title>", body, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title else re.sub(r"<[^>]+>", " ", body)
        text = html.unescape(text)
    text = " ".join(text.split())
    return (text[:limit] + "...") if len(text) > limit else (text or "empty body")


def check_base_url(url: str) -> None:
    """An http(s) URL with a host, refused at once otherwise (not retried for half a minute)."""
    from urllib.parse import urlparse

    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 (raises on a bad port)
    except ValueError as err:
        raise HeadstartError(
            f"--base-url {url!r} is not a valid URL ({err})", "e.g. --base-url http://localhost:8000/v1"
        ) from None
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise HeadstartError(
            f"--base-url {url!r} must be an http:// or https:// URL with a host",
            "e.g. --base-url http://localhost:8000/v1",
        )


def _retry_after(headers: Any) -> float | None:
    try:
        return float((headers or {}).get("Retry-After", ""))
    except ValueError:
        return None
