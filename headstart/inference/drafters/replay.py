"""The replay drafter: drafts the target's own greedy continuation, each draft made wrong with
probability 1 - P, for measuring the decode loop on any target shape without trained heads (an
8B-shape random-weight target on a GPU: what a round costs in plain steps at a chosen acceptance).

    --draft-model replay:accept=0.8                   P = 0.8, any --tree (default chain:4)
    --draft-model replay:accept=0.6,seed=3,horizon=512

Per row it replays a stream: the prompt, then the target's greedy continuation from a plain pass
(`horizon` tokens at the prefill, extended by `horizon` more when the decode nears its end). At a
draft, every child of a node at depth d proposes the stream's token at the root's position + d + 1,
or, with probability 1 - P (a seeded draw per row and depth), another token: a chain of depth D
then accepts 1 + P + ... + P^D tokens a round in expectation (bonus included). Its draft
distribution puts ~all its mass on that token, so sampling stays exact (the verifier's rule), it
merely accepts less where the sampled text leaves the greedy stream.

Costs: the plain pass (one target forward a token, before decoding and at each extension: not a
cost to time a round by); a draft is a gather and a draw on the device, no host read, no model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.trees.spec import TreeChoice, choose_tree

PREFIX = "replay"
USAGE = "use replay:accept=0.8 (P in (0, 1]; optional seed=N, horizon=N)"
DEFAULT_TREE = "chain:4"
PEAK = 30.0
"""The draft token's logit over 0 for every other: its probability ~1 under any vocabulary here."""


@dataclass(frozen=True)
class ReplaySpec:
    accept: float = 0.8
    """P: the chance that each draft is the stream's token."""
    seed: int = 0
    horizon: int = 256
    """Tokens of greedy continuation replayed from the prefill (and added at each extension)."""

    def __post_init__(self) -> None:
        if not 0 < self.accept <= 1:
            raise HeadstartError(f"replay: accept={self.accept} is not in (0, 1]", USAGE)
        if not 1 <= self.horizon <= 1 << 20:
            raise HeadstartError(f"replay: horizon={self.horizon} is not in 1..1048576", USAGE)

    @property
    def text(self) -> str:
        return f"{PREFIX}:accept={self.accept:g},seed={self.seed},horizon={self.horizon}"


def parse_replay(spec: str) -> ReplaySpec:
    """'replay' or 'replay:accept=P[,seed=N][,horizon=N]' -> a ReplaySpec (one line on errors)."""
    from headstart.inference.trees.options import options

    head, _, text = spec.strip().partition(":")
    if head != PREFIX:
        raise HeadstartError(f"not a replay spec: '{spec}'", USAGE)
    if spec.strip() == PREFIX:
        return ReplaySpec()
    return ReplaySpec(**options(spec, text, {"accept": float, "seed": int, "horizon": int}, USAGE))  # type: ignore[arg-type]


# ---- its registration's pieces (headstart/catalogue.py) ----
def load(target: Any, spec: str, tree: Any, greedy: bool) -> tuple[Replay, TreeChoice]:
    """`--draft-model replay:accept=P` and its tree (`--tree`, else chain:4)."""
    choice = choose_tree(tree if tree is not None else DEFAULT_TREE)
    return Replay(target, parse_replay(spec)), choice if greedy else choice.for_sampling()


def tune_candidates(target: Any) -> list[str]:
    return [f"{PREFIX}:accept={p}" for p in (0.6, 0.8)]


def default_spec(target: Any) -> str:
    return f"{PREFIX}:accept=0.8"


@dataclass(frozen=True)
class Replay:
    """What the decoder takes where it takes heads (`new_drafter` makes each batch's drafter)."""

    target: Any
    spec: ReplaySpec

    @property
    def describe(self) -> str:
        return f"replay of the target's greedy continuation (each draft right with probability {self.spec.accept:g})"

    def bind(self, target_model: Any) -> None:
        """Nothing to attach: it reads the committed tokens only."""

    def new_drafter(self, vocab_size: int, depth: int | None = None) -> ReplayDrafter:
        return ReplayDrafter(self.target, self.spec, vocab_size)


class ReplayDrafter:
    """One batch's streams, a row each (rows come and go with requests)."""

    feature_layers: tuple[int, ...] = ()  # reads committed tokens only
    max_depth: int | None = None  # any depth: the stream goes on

    def __init__(self, target: Any, spec: ReplaySpec, vocab_size: int) -> None:
        self.target, self.spec, self.vocab_size = target, spec, vocab_size
        self.first: torch.Tensor | None = None  # (B,) each prompt's first token (`start`)
        self.stream: torch.Tensor | None = None  # (B, W) token at each position: prompt, then the replay
        self.root_pos: torch.Tensor | None = None  # (B,) the root's position
        self.reach = 0  # a bound on every row's root position, known on the host (no device read)
        self.generator = torch.Generator(device=target.device).manual_seed(spec.seed)

    def start(self, first_tokens: torch.Tensor) -> None:
        self.first = first_tokens

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        if self.stream is None:  # the prefill: each row's prompt and its root, then the plain pass
            assert self.first is not None, "the prefill hands the first tokens to `start` first"
            rows = _rows(self.first, next_tokens, valid)  # host sync: once, at the prefill
            self.stream = _pad(self._replayed(rows), next_tokens.device)
            self.reach = max(len(row) for row in rows)
        else:
            self.reach += next_tokens.shape[1]  # a step commits at most its observe's width a row
        self.root_pos = positions.gather(1, last[:, None])[:, 0] + 1  # (B,)

    def root_logits(self) -> torch.Tensor:
        return self._logits(1, 1)[:, 0]

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return self._logits(depth + 1, nodes.shape[1])

    def end_step(self) -> None:
        """Nothing drafted is kept: the stream is the truth, the root position the state."""

    def select_rows(self, rows: torch.Tensor) -> None:
        assert self.stream is not None and self.root_pos is not None
        self.stream, self.root_pos = self.stream[rows], self.root_pos[rows]

    def merge(self, other: ReplayDrafter) -> None:
        assert self.stream is not None and other.stream is not None
        width = max(self.stream.shape[1], other.stream.shape[1])
        self.stream = torch.cat([_widen(self.stream, width), _widen(other.stream, width)])
        self.root_pos = torch.cat([self.root_pos, other.root_pos])  # type: ignore[list-item]
        self.reach = max(self.reach, other.reach)

    # ---- the captured round (inference/captured_round.py) ------------------------------------
    def round_inputs(self, plan: Any) -> ReplayInputs | None:
        """The stream and root positions for the round program (extended first where the round
        could reach past the stream: a host-side bound, no read)."""
        if self.stream is None or self.root_pos is None:
            return None
        if self.reach + plan.path_width >= self.stream.shape[1]:
            # the bound counts A a round (the program's widths), the rows move by what they
            # accepted: near the end, read where they are (host sync: only then) before extending
            self.reach = int(self.root_pos.max())
        if self.reach + plan.path_width >= self.stream.shape[1]:
            self._extend()  # cost: a plain pass, and one compile for the longer stream
        key = (self.spec.accept, self.vocab_size)
        parts = _PARTS.get(key)
        if parts is None:
            parts = _PARTS[key] = ReplayParts(*key)
        return ReplayInputs(parts, (self.stream, self.root_pos))

    def round_done(self, root_pos: torch.Tensor, width: int) -> None:
        self.root_pos = root_pos
        self.reach += width

    # ---- its own steps ----
    def _logits(self, depth: int, width: int) -> torch.Tensor:
        """(B, width, V): every node of the frontier proposes the stream's token `depth` past the
        root, or another one with probability 1 - P (one draw per row and depth)."""
        assert self.stream is not None and self.root_pos is not None
        if self.reach + depth >= self.stream.shape[1]:
            self._extend()
        rows = self.stream.shape[0]
        index = (self.root_pos + depth).clamp(max=self.stream.shape[1] - 1)
        truth = self.stream.gather(1, index[:, None])[:, 0]  # (B,)
        draws = torch.rand(rows, generator=self.generator, device=truth.device)
        other = torch.randint(1, self.vocab_size, (rows,), generator=self.generator, device=truth.device)
        token = torch.where(draws < self.spec.accept, truth, (truth + other) % self.vocab_size)
        logits = torch.zeros(rows, width, self.vocab_size, device=truth.device)
        logits.scatter_(2, token[:, None, None].expand(rows, width, 1), PEAK)
        return logits

    def _extend(self) -> None:
        """`horizon` more tokens of greedy continuation for every row (a plain pass from its stream)."""
        assert self.stream is not None
        ends = (self.stream != -1).sum(1).tolist()  # host sync: only at an extension
        rows = [row[:end] for row, end in zip(self.stream.tolist(), ends, strict=True)]
        self.stream = _pad(self._replayed(rows), self.stream.device)

    def _replayed(self, rows: list[list[int]]) -> list[list[int]]:
        """Each row followed by `horizon` tokens of its greedy continuation: one plain pass per
        distinct row (a batch of one prompt repeated, as a sampling test draws, costs one pass)."""
        done: dict[tuple[int, ...], list[int]] = {}
        for row in rows:
            if tuple(row) not in done:
                done[tuple(row)] = row + continuation(self.target, row, self.spec.horizon)
        return [done[tuple(row)] for row in rows]


@torch.no_grad()
def continuation(target: Any, tokens: list[int], count: int) -> list[int]:
    """The target's greedy continuation of `tokens` (whose last is the root, already chosen):
    `count` tokens, past any end-of-sequence token (a decode without eos goes on too)."""
    from headstart.targets import forward, new_cache

    model, device = target.model, target.device
    cache = new_cache(model)
    logits = forward(
        model, torch.tensor([tokens[:-1]], device=device), past_key_values=cache, logits_to_keep=1
    )
    token = torch.tensor([[tokens[-1]]], device=device)
    out = []
    for step in range(count):
        position = torch.tensor([[len(tokens) - 1 + step]], device=device)
        logits = forward(model, token, position_ids=position, past_key_values=cache).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
        out.append(token)
    return torch.cat(out, 1)[0].tolist() if out else []  # host sync: once per pass


def _rows(first: torch.Tensor, next_tokens: torch.Tensor, valid: torch.Tensor) -> list[list[int]]:
    """Each row's committed tokens: its first, then the next tokens of its real positions."""
    host_first, host_next, host_valid = first.tolist(), next_tokens.tolist(), valid.tolist()
    return [[f] + [t for t, v in zip(n, m, strict=True) if v] for f, n, m in zip(host_first, host_next, host_valid,
                                                                                strict=True)]  # fmt: skip


def _pad(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [-1] * (width - len(row)) for row in rows], device=device)


def _widen(stream: torch.Tensor, width: int) -> torch.Tensor:
    if stream.shape[1] == width:
        return stream
    return torch.cat([stream, stream.new_full((stream.shape[0], width - stream.shape[1]), -1)], 1)


@dataclass(frozen=True)
class ReplayInputs:
    parts: ReplayParts
    tensors: tuple[torch.Tensor, torch.Tensor]  # the streams (B, W), the roots' positions (B,)


class ReplayParts:
    """The replay drafter's share of the round program: its drafts from the stream on the
    device, each wrong with probability 1 - P (the program's own draws: no generator inside a
    compiled program, so a seed does not replay the eager steps' choices; tau follows P alike)."""

    def __init__(self, accept: float, vocab: int) -> None:
        self.accept, self.vocab = accept, vocab

    def drafter(self, head: tuple[torch.Tensor, torch.Tensor]) -> ProgramReplay:
        return ProgramReplay(self, *head)

    def round_observe(self, last: torch.Tensor, layers: dict[int, torch.Tensor], committed: torch.Tensor,
                      positions: torch.Tensor, real: torch.Tensor, last_index: torch.Tensor,
                      head: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # fmt: skip
        return positions.gather(1, last_index[:, None])[:, 0] + 1


class ProgramReplay:
    """ReplayDrafter's `root_logits` and `expand` inside the round program."""

    max_depth = None

    def __init__(self, parts: ReplayParts, stream: torch.Tensor, root_pos: torch.Tensor) -> None:
        self.parts, self.stream, self.root_pos = parts, stream, root_pos

    def root_logits(self) -> torch.Tensor:
        return self._logits(1, 1)[:, 0]

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return self._logits(depth + 1, nodes.shape[1])

    def _logits(self, depth: int, width: int) -> torch.Tensor:
        rows, vocab = self.stream.shape[0], self.parts.vocab
        index = (self.root_pos + depth).clamp(max=self.stream.shape[1] - 1)
        truth = self.stream.gather(1, index[:, None])[:, 0]
        draws = torch.rand(rows, device=truth.device)
        other = torch.randint(1, vocab, (rows,), device=truth.device)
        token = torch.where(draws < self.parts.accept, truth, (truth + other) % vocab)
        logits = torch.zeros(rows, width, vocab, device=truth.device)
        return logits.scatter(2, token[:, None, None].expand(rows, width, 1), PEAK)


_PARTS: dict[tuple[float, int], ReplayParts] = {}
"""One parts object per (P, vocabulary): the program is specialized on it (a new one per
generation would recompile it; P is a constant inside)."""
