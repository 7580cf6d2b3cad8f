"""Who writes the replies: the engines behind `headstart distill --engine`.

Every engine answers a stream of `Request`s (a rendered prompt, its sampling settings and seed)
and calls `on_reply(request, reply)` as each finishes; the callback may return follow-up requests
(a conversation's next turn), which are answered before new conversations start.

    headstart   continuous batching through headstart's decoding engine (inference/engine.py):
                up to --batch-size conversations in flight, finished rows refilled at once.
                Full-attention decoder targets (the default).
    generate    transformers' `generate` over static batches of --batch-size prompts: any model
                transformers can generate with (the reference; slower).
    dataset     no generation: each turn is answered with the data's own reply (`Request.reference`),
                tokenized as the target's chat template renders it. Training on replies people
                already have; the target's own replies (the other engines) usually draft better.
    openai      an OpenAI-compatible chat-completions server serving the target (distill/api.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from headstart.distill.replies import Sampling, generate_batch
from headstart.inference.requests import EngineStats, Reply, Request
from headstart.targets import Target

ENGINES = ("headstart", "generate", "dataset", "openai")
OnReply = Callable[[Request, Reply], Iterable[Request] | None]


class HeadstartEngine:
    """Continuous batching on headstart's one decoding engine (inference/engine.py, as `generate`
    and `serve` run), plain: a chat template's shared opening prefilled once per group."""

    name = "headstart"

    def __init__(self, target: Target, batch_size: int) -> None:
        from headstart.inference.batcher import EngineBatcher

        self.batcher = EngineBatcher(target, max_batch=batch_size, admit_every=max(1, batch_size // 8))

    def run(self, requests: Iterable[Request], on_reply: OnReply) -> EngineStats:
        return self.batcher.run(requests, on_reply)


class GenerateEngine:
    """transformers' `generate`, batch by batch (left padding; a batch ends when its last row does)."""

    name = "generate"

    def __init__(self, target: Target, batch_size: int) -> None:
        self.target = target
        self.batch_size = batch_size
        self.stats = EngineStats()

    def run(self, requests: Iterable[Request], on_reply: OnReply) -> EngineStats:
        import time

        source = iter(requests)
        queue: deque[Request] = deque()
        while True:
            while len(queue) < self.batch_size and (nxt := next(source, None)) is not None:
                queue.append(nxt)
            if not queue:
                return self.stats
            batch = [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]
            start = time.perf_counter()
            # One call per distinct sampling setting (distill uses one for all requests).
            first = batch[0].sampling
            sampling = Sampling(first.max_new_tokens, first.temperature, first.top_p, first.top_k)
            replies = generate_batch(self.target, [r.prompt for r in batch], sampling, seed=batch[0].seed)
            self.stats.decode_s += time.perf_counter() - start
            follow: list[Request] = []
            for request, reply in zip(batch, replies, strict=True):
                self.stats.replies += 1
                self.stats.new_tokens += len(reply.token_ids) + int(reply.finished)
                self.stats.prompt_tokens += len(request.prompt)
                follow += list(on_reply(request, Reply(reply.token_ids, reply.finished)) or [])
            queue.extendleft(reversed(follow))


class DatasetEngine:
    """Answers every request with its `reference` reply (the data's own), ids as the tokenizer
    encodes the text (the record's mask comes from the rendered template, as for generated replies)."""

    name = "dataset"

    def __init__(self, target: Target) -> None:
        self.tokenizer = target.tokenizer
        self.stats = EngineStats()

    def run(self, requests: Iterable[Request], on_reply: OnReply) -> EngineStats:
        source, queue = iter(requests), deque[Request]()
        while queue or (nxt := next(source, None)) is not None:
            request = queue.popleft() if queue else nxt
            if request.reference is None:
                raise ValueError("the dataset engine needs requests with a reference reply")
            ids = self.tokenizer.encode(request.reference, add_special_tokens=False)
            self.stats.replies += 1
            self.stats.new_tokens += len(ids)
            queue.extendleft(reversed(list(on_reply(request, Reply(ids, finished=True)) or [])))
        return self.stats


def make_engine(name: str, target: Target, batch_size: int, endpoint: Any = None) -> Any:
    """The engine called `name` (one of ENGINES) for `target` (`endpoint`: the openai engine's)."""
    if name == "openai":
        from headstart.distill.api import OpenAIEngine

        return OpenAIEngine(target.tokenizer, endpoint)
    if name == "generate":
        return GenerateEngine(target, batch_size)
    if name == "dataset":
        return DatasetEngine(target)
    from headstart.errors import HeadstartError
    from headstart.targets.layer_kinds import layer_kinds

    # The batcher moves cache columns between rows: full and sliding-window layers only (the
    # window is applied by the mask over a cache that keeps every entry; targets/layer_kinds.py).
    bad = layer_kinds(target.model).unsupported
    if bad:
        raise HeadstartError(
            f"the headstart distill engine cannot batch a target with {', '.join(bad)} layers",
            "use --engine generate for this target",
        )
    return HeadstartEngine(target, batch_size)
