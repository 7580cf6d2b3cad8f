"""What the HTTP handlers share: the target, the decode loop, the limits and options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headstart.serve.metrics import Metrics
from headstart.serve.scheduler import Scheduler


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
