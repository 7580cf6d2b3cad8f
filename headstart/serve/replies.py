"""One request through the decode loop: its choices (one per prompt and per `n`) are queued
together so that they join one wave of the continuous engine, decoded as rows of their own
(a sampled choice draws from its own seeded generator: `seed + i` for the i-th of a prompt's n,
vLLM's rule), scored when logprobs are asked (logprobs.py), and answered as one response, whole
or streamed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from headstart.inference.engine import Job
from headstart.inference.stops import StopRule
from headstart.serve import logprobs as lp
from headstart.serve.bodies import Refused, Reply, error_body, new_id
from headstart.serve.protocol import Sampling
from headstart.serve.scheduler import Closing, QueueFull, Ticket
from headstart.serve.served import Served
from headstart.serve.text import TextStream

log = logging.getLogger("headstart.serve")


@dataclass
class Choice:
    job: Job
    ticket: Ticket
    text: TextStream
    echo: str = ""  # the prompt's text before the reply (completions' echo)
    scored: lp.Scored | None = None

    @property
    def index(self) -> int:
        return self.ticket.index

    def reason(self) -> str:
        return "stop" if self.text.stopped or self.job.finish == "stop" else "length"


@dataclass(frozen=True)
class Asked:
    """What the handler read from the body: prompts as token ids and what to return."""

    endpoint: str
    chat: bool
    prompts: list[list[int]]
    limit: int | None  # max_tokens as asked (None: the server's default)
    echoes: list[str]  # per prompt: its text when echoed, else ""
    top: int | None  # logprobs: alternatives per token; None: no logprobs
    where: str  # the field holding the prompt
    echo: bool = False  # the prompt's text and (with logprobs) its logprobs come first


def token_limit(served: Served, prompt: int, asked: int | None, where: str) -> int:
    """max_tokens for a prompt of `prompt` tokens, or the 400 that says why not (OpenAI's and
    vLLM's status for `context_length_exceeded`, which clients key their handling on)."""
    if prompt > served.context or (prompt == served.context and asked != 0):
        raise Refused(400, f"prompt of {prompt} tokens leaves no room in the context of {served.context}",
                      where, "context_length_exceeded")  # fmt: skip
    # a request that names no max_tokens gets the default, within this server's own limit
    limit = (
        asked if asked is not None else min(served.default_tokens, served.max_tokens, served.context - prompt)
    )
    if limit > served.max_tokens:
        raise Refused(
            400, f"max_tokens {limit} exceeds this server's limit of {served.max_tokens}", "max_tokens"
        )
    if prompt + limit > served.context:
        raise Refused(400, f"prompt of {prompt} tokens + max_tokens {limit} exceeds the context of "
                      f"{served.context}", where, "context_length_exceeded")  # fmt: skip
    return limit


def make_choices(served: Served, body: Sampling, asked: Asked) -> list[Choice]:
    target, loop, events = served.target, asyncio.get_running_loop(), asyncio.Queue()
    stops, warp = body.stop_strings(), body.warp()
    if asked.top is not None and body.stream:
        raise Refused(400, "logprobs are computed by one forward over the finished reply (so that they do not "
                      "depend on heads or batching), not while streaming; send stream: false", "logprobs")  # fmt: skip
    count = len(asked.prompts) * body.n
    if count > served.scheduler.max_queue:
        raise Refused(400, f"{count} choices (prompts x n) exceed this server's queue of "
                      f"{served.scheduler.max_queue} (--max-queue); send fewer at a time", "n")  # fmt: skip
    choices = []
    for p, (prompt, echo) in enumerate(zip(asked.prompts, asked.echoes, strict=True)):
        limit = token_limit(served, len(prompt), asked.limit, asked.where)
        rule = StopRule(limit, frozenset(target.eos_token_ids), stops, target.tokenizer)
        for j in range(body.n):
            seed = None if body.seed is None else (body.seed + j) % 2**63
            job = Job(key=new_id("row"), prompt=prompt, rule=rule, seed=seed)
            ticket = Ticket(
                job, warp, loop, events, index=p * body.n + j, after=_scorer(target, asked, prompt)
            )
            job.on_tokens = lambda tokens, t=ticket: t.post("tokens", tokens)
            choices.append(Choice(job, ticket, TextStream(target.tokenizer, stops), echo))
    return choices


def _scorer(target: Any, asked: Asked, prompt: list[int]) -> Any:
    if asked.top is None:
        return None
    start = 0 if asked.echo else len(prompt)
    top = asked.top
    return lambda job: lp.score(target, job.prompt + job.emitted, start, top)


async def respond(served: Served, body: Sampling, asked: Asked, request: Request) -> Any:
    choices = make_choices(served, body, asked)
    try:
        served.scheduler.submit(*[c.ticket for c in choices])
    except QueueFull:
        raise Refused(429, "too many requests waiting; retry later") from None
    except Closing:
        raise Refused(503, "the server is shutting down") from None
    reply = Reply(new_id("chatcmpl" if asked.chat else "cmpl"), served.model, int(time.time()), asked.chat,
                  body.include_usage())  # fmt: skip
    started = time.perf_counter()
    if body.stream:
        served.metrics.request(asked.endpoint, 200)
        return StreamingResponse(
            _events(served, reply, choices, asked, started), media_type="text/event-stream"
        )
    try:
        finished = await _unless_gone(_drain(choices), request)
    finally:
        _release(served, choices)  # a client that went away (or an error) frees its rows at once
    if not finished:
        served.metrics.request(asked.endpoint, 499)  # nginx's "client closed request": nobody reads this
        log.info("%s: the client went away; its row is freed", asked.endpoint)
        return JSONResponse(error_body("the client closed the request", "invalid_request_error"), 499)
    _served(served, asked, choices, started)
    served.metrics.request(asked.endpoint, 200)
    pieces = lp.Pieces(served.target.tokenizer)
    shape = lp.chat_logprobs if asked.chat else lp.completion_logprobs
    out, completion = [], 0
    for c in choices:
        text = c.text.text  # the one decode of the reply; it notes a stop string for reason()
        kept = c.text.covering()  # a stop string's own tokens are in neither the text, usage nor logprobs
        completion += kept
        logprobs = None
        if c.scored is not None:
            echoed = len(c.scored.tokens) - len(c.job.emitted)  # the prompt's tokens, when echoed
            logprobs = shape(lp.keep(c.scored, echoed + kept), pieces)
        out.append(reply.choice(c.index, c.echo + text, c.reason(), logprobs))
    return JSONResponse(reply.whole(out, sum(map(len, asked.prompts)), completion))


def _failure(err: Exception) -> Refused:
    """A request the decode loop failed."""
    if isinstance(err, Closing):
        return Refused(503, str(err))
    return Refused(500, f"generation failed: {str(err) or type(err).__name__}")


async def _drain(choices: list[Choice]) -> bool:
    events, left = choices[0].ticket.events, len(choices)
    while left:
        index, kind, value = await events.get()
        choice = choices[index]
        if kind == "tokens":
            choice.text.feed(value)  # decoded once, when the reply is complete
        elif kind == "scored":
            choice.scored = value
        elif kind == "done":
            left -= 1
        else:
            raise _failure(value)
    return True


async def _unless_gone(work: Any, request: Request) -> bool:
    """`work`'s result, or False when the client went away first. Starlette cancels a streamed
    response whose client leaves, but not a plain one: without this race its rows would decode
    to max_tokens for nobody."""
    done_first = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({done_first, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (done_first, gone):
            task.cancel()
    return done_first.result() if done_first in done else False


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body is read: receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _release(served: Served, choices: list[Choice]) -> None:
    unfinished = [c.job for c in choices if c.job.finish is None]
    for job in unfinished:
        job.cancelled = True
    if unfinished:
        with served.scheduler.wake:
            served.scheduler.wake.notify()


def _served(served: Served, asked: Asked, choices: list[Choice], started: float) -> None:
    firsts = [c.job.first_token_s for c in choices if c.job.first_token_s is not None]
    first = max(0.0, min(firsts) - started) if firsts else None
    completion = sum(len(c.job.emitted) for c in choices)
    served.metrics.served(sum(map(len, asked.prompts)), completion, time.perf_counter() - started, first)


async def _events(served: Served, reply: Reply, choices: list[Choice], asked: Asked,
                  started: float) -> AsyncIterator[str]:  # fmt: skip
    def event(data: dict[str, Any]) -> str:
        return f"data: {json.dumps(data)}\n\n"

    try:
        for choice in choices:  # chat: the role first; completions: an echoed prompt first
            if asked.chat or choice.echo:
                yield event(reply.chunk(choice.index, text=choice.echo or None, role=asked.chat))
        events, left = choices[0].ticket.events, len(choices)
        while left:
            index, kind, value = await events.get()
            choice = choices[index]
            if kind == "tokens":
                text = choice.text.push(value)
                if text:
                    yield event(reply.chunk(index, text=text))
            elif kind == "done":
                left -= 1
                rest = choice.text.finish()
                if rest:
                    yield event(reply.chunk(index, text=rest))
                yield event(reply.chunk(index, finish=choice.reason()))
            elif kind == "error":
                yield event(error_body(_failure(value).message, "server_error"))
                return
        if reply.include_usage:
            yield event(
                reply.usage_chunk(sum(map(len, asked.prompts)), sum(c.text.covering() for c in choices))
            )
        yield "data: [DONE]\n\n"
        _served(served, asked, choices, started)
    finally:  # the client went away mid-stream (the generator is closed): its rows leave at once
        _release(served, choices)
