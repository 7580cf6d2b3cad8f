"""What the HTTP handlers share: the target, the decode loop, the limits and options."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from headstart.serve.metrics import Metrics
from headstart.serve.scheduler import Scheduler

log = logging.getLogger("headstart.serve")


@dataclass
class Served:
    target: Any  # tokenizer, chat template, the model the scoring forward runs
    scheduler: Scheduler
    metrics: Metrics
    model: str  # the id clients name (`--served-model-name`, default the --target given)
    context: int  # the target's context: prompt + max_tokens must fit
    max_tokens: int  # the most tokens a request may ask for
    default_tokens: int  # a chat request that names no max_tokens gets this many at most
    api_key: str | None = None
    mode: str = "plain decoding"
    allowed_origins: tuple[str, ...] = ()  # CORS (--allowed-origins): pages that may call from a browser
    max_body: int = (
        16 * 2**20
    )  # bytes a request body may hold (--max-body-mb): 413 past it, before it is read
    body_timeout: float = 30.0  # seconds a request body may take to arrive (--body-timeout): 408 past it


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a compiled server's lanes run at: powers of two up to `max_batch`'s."""
    sizes = [1]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def assemble(target: Any, decoding: Any, *, model: str, max_batch: int, max_queue: int,
             speculate_up_to: int | None, prefix_cache: bool, max_tokens: int | None, default_tokens: int,
             api_key: str | None, allowed_origins: tuple[str, ...], max_body: int, body_timeout: float,
             recorder: Any = None) -> Served:  # fmt: skip
    """The server's shared state around `decoding` (headstart.decoding.Decoding): the context a
    request must fit (cut below a longrope/dynamic RoPE switch), its scheduler and metrics. On a
    CPU a batch steps plainly past one tree's worth of rows unless `speculate_up_to` says.
    `recorder`: serve --record's (serve/record.py), or None."""
    from headstart.targets.exactness import context_note, positions

    context = int(getattr(target.config, "max_position_embeddings", None) or 4096)
    limits = positions(target.model)
    note = context_note(limits, context)
    if note is not None:  # longrope/dynamic RoPE: requests must end below its switch
        log.warning("warning: %s; serving a context of %d", note, limits.switch)
        context = int(limits.switch)
    metrics = Metrics()
    speculator = decoding.speculator
    probe = speculator.new_decoder()  # built now: what a decoder refuses fails at startup, not at a request
    if speculate_up_to is None and target.device.type == "cpu":
        # measured: 8 rows decode 2x faster plainly than with trees on 2 cores
        speculate_up_to = probe.verify_nodes
    buckets = batch_buckets(max_batch) if speculator.compile else ()
    if buckets:
        log.info("compiled: each lane's batch runs at %s rows (padded with copies of a live row); a size "
                 "compiles on the first request that reaches it", ", ".join(map(str, buckets)))  # fmt: skip
    scheduler = Scheduler(speculator.new_decoder, metrics, max_batch=max_batch, max_queue=max_queue,
                          speculate_up_to=speculate_up_to, prefix_cache=prefix_cache, recorder=recorder,
                          batch_buckets=buckets)  # fmt: skip
    return Served(target=target, scheduler=scheduler, metrics=metrics, model=model, context=context,
                  max_tokens=min(max_tokens or context, context), default_tokens=default_tokens, api_key=api_key,
                  mode=decoding.mode, allowed_origins=allowed_origins, max_body=max_body,
                  body_timeout=body_timeout)  # fmt: skip
