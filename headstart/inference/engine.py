"""The one continuous speculative engine: requests join the running batch between steps and leave
it when they stop, and every step is the round's [draft -> verify -> accept -> commit]
(inference/steps.py) over all live rows in ONE target forward. The batch's state lives here: the
rows (`DecodeState`), their jobs, their drafter, their sampling generator; the steps below know
no batch. `SpeculativeDecoder.generate` runs it with every prompt admitted at once; `headstart
serve` admits requests as they arrive.

Joining: newcomers are prefilled together (one left-padded target forward, their own drafter),
then merged into the live batch: their KV caches and the drafter's are left-padded to a common
width with entries no row sees (`visible` False) and stacked under the live rows, so every
row keeps its own positions. Leaving: finished rows are dropped (`select_rows`), and columns no
remaining row sees are cut off the left (a wide prompt that left does not tax the others).

Reading ahead (`read_ahead`, plain decoding: a root-only tree and no drafter): a step's tokens
are copied to the host without waiting (pinned memory and an event on CUDA) and read only after
the next step is queued, so the device is never idle while the host applies stops, streams and
bookkeeping. Stops therefore act one step late: a row that stopped has one more step queued,
whose token is dropped (the row leaves then, so every remaining row's tokens and cache are what
they were). The host knows each step's widths (one token a row), so no step waits on a read.

Sampling is per row: each job may carry its own seeded generator (`RowGenerators`), so a seeded
reply does not depend on which requests shared its steps (up to float rounding in attention,
as any batching); rows of one engine share the warping (temperature, top-p, top-k): a server
keeps one engine per setting.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from headstart.inference import cache as kv
from headstart.inference.drafters import Drafter, make_drafter
from headstart.inference.grouping import prefill_groups, prefill_overhead_tokens
from headstart.inference.pending import Deferred, PendingObservations
from headstart.inference.plain import SamplingConfig
from headstart.inference.prefix import SharedPrefix
from headstart.inference.prompts import PrefillAborted, prepare_prompts
from headstart.inference.results import DecodeState, DecodeStats, position_bucket
from headstart.inference.sampling import Generator, RowGenerators
from headstart.inference.steps import Steps, unpack_report
from headstart.inference.stops import StopRule


@dataclass
class Job:
    """One request in flight: its prompt ids, when it stops, where its tokens go."""

    key: Any
    prompt: list[int]
    rule: StopRule
    seed: int | None = None
    on_tokens: Callable[[list[int]], None] | None = None
    """Called with each step's new tokens (streaming)."""
    emitted: list[int] = field(default_factory=list)
    finish: str | None = None
    """Why it stopped: "stop" (an end-of-sequence id or a stop string), "length", "cancelled"."""
    cancelled: bool = False
    """Set from any thread (a client went away): the row leaves at the next step."""
    stop_context: list[int] = field(default_factory=list)
    """Text a stop string may begin in before the reply: `generate` passes the prompt (transformers'
    StopStringCriteria matches over the whole sequence); OpenAI-style servers match the reply only."""
    steps: int = 0  # verify forwards the row took part in
    committed: int = 0  # tokens those forwards committed (its tau = committed / steps)
    admitted_s: float = 0.0
    first_token_s: float | None = None


@dataclass
class Unread:
    """A queued plain step's tokens on their way to the host: read once the next step is queued."""

    # (B, 1): pinned host memory on CUDA (filled by a non-blocking copy), else the tokens themselves
    tokens: torch.Tensor
    ready: Any  # a CUDA event recorded after the copy; None on the CPU (nothing runs ahead)
    jobs: list[Job]  # the rows it was queued for, in order (rows that leave before it is read drop out)
    counted: bool = False  # a round program's report: each row's count, then its tokens

    @classmethod
    def queue(cls, tokens: torch.Tensor, jobs: list[Job], counted: bool = False) -> Unread:
        if tokens.device.type != "cuda":
            return cls(tokens, None, list(jobs), counted)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(host, ready, list(jobs), counted)


class Engine:
    """Continuous speculative decoding of jobs that share one SamplingConfig's warping."""

    def __init__(self, decoder: Steps, sampling: SamplingConfig, row_seeds: bool = False,
                 speculate_up_to: int | None = None, shared_prefix: int = 0,
                 prefill_tokens: int | None = None, prefix: SharedPrefix | None = None,
                 abortable: bool = False, read_ahead: bool | None = None,
                 batch_buckets: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.decoder = decoder  # the round's steps (a SpeculativeDecoder is one)
        # A server's compiled steps (`batch_buckets`, e.g. (1, 2, 4, 8)): before a round the live
        # batch is padded up to the next bucket with `ghosts`, copies of its first row that
        # decode alongside it and are never read, so the compiled verify and round program meet
        # a handful of batch sizes (each compiled once) and not every count of live requests.
        # Ghosts are dropped before the batch changes (a join, a leave) and added back after it:
        # the eager path runs only then. cost: a ghost's share of each forward.
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.ghosts = 0
        # plain decoding reads each step's tokens after queuing the next (see the module's note);
        # None: on CUDA only (on a CPU nothing runs ahead, and a row that stops costs one more step)
        self.read_ahead = decoder.target.device.type == "cuda" if read_ahead is None else read_ahead
        self.unread: Unread | None = None
        # a server's engine: a long prompt prefills in chunks, stopped once all its clients left
        # (or the grace period ended); `generate` has no one to leave and prefills in one forward
        self.abortable = abortable
        # Newcomers are prefilled in groups of like length (inference/grouping.py), each of at most
        # this many padded tokens when given (a bound on a prefill's memory); None: no bound
        self.prefill_tokens = prefill_tokens
        # Newcomers that open with the same >= this many tokens prefill them once (inference/
        # prefix.py; 0 = off); uncaptured only. `prefix`: one kept by the caller across engines (a
        # server's lanes come and go), usable if it keeps the layers this decoder's drafter reads
        if prefix is None and shared_prefix > 0:
            prefix = SharedPrefix(decoder.target, shared_prefix, layers=decoder.feature_layers)
        # a drafter object takes one prefill (`_splittable`); a prefix may split a group in two
        usable = prefix is not None and self._splittable()
        self.prefix = prefix if usable and set(decoder.feature_layers) <= set(prefix.layers) else None
        self.prefix_reused = 0  # prompt tokens copied from a shared prefix instead of run per row
        # Speculate only while live rows x tree nodes stay within this many verify tokens; past it
        # a step is plain (the root alone; the drafter observes its tokens when it next drafts).
        # On a CPU a verify's cost grows with its tokens, so a big batch decodes faster plainly;
        # None: always speculate.
        self.speculate_up_to = speculate_up_to
        # the batch's rows in groups, each with its drafter (inference/pending.py): what plain
        # steps commit, and the prompts of requests that join a batch stepping plainly, wait here
        # for the drafter's next draft: head modules only (a drafter object may count its
        # observations), uncaptured (the captured steps bucket an observe's width): the
        # `_splittable` case, with heads
        self.pending = PendingObservations()
        # at most this many positions wait per group past its prompt: bounds what they hold
        # (features per row and position: ~9 KB for SmolLM2's EAGLE-3 taps) and the width of the
        # one observe that feeds them (a head's mask is rows x width x cache). A reply shorter than
        # this that ends while the batch steps plainly never runs the head.
        self.pending_limit = 512
        self._defers = decoder.heads is not None and self._splittable()
        self.sampling = sampling
        self.row_seeds = row_seeds  # per-job generators (a server) or one for the batch (generate)
        self._batch_gen: torch.Generator | None = None  # the batch's one, when seeded (not row_seeds)
        self.generator: Generator = None  # what the steps draw from: the batch's, or one per row
        self.jobs: list[Job] = []  # aligned with the state's rows
        self.lead: list[int] = []  # per row: leading cache columns it does not see (padding)
        self.state: DecodeState | None = None
        self.drafter: Any = None
        self.stats = DecodeStats(batch_size=0, lossy=decoder.typical and not sampling.greedy)
        self.target_forwards = 0
        self.prefills = 0
        self.plain_steps = 0
        decoder.tree.prepare(decoder.target.device)  # what the tree builds once per device

    @property
    def live(self) -> int:
        return len(self.jobs)

    # ---- joining ------------------------------------------------------------------------------
    @torch.no_grad()
    def add(self, jobs: list[Job]) -> list[Job]:
        """Prefill `jobs` and merge them into the live batch; their first token comes from the
        prefill. Returns the jobs that already finished on that token (and any live job that a
        read-ahead step's tokens, taken first, finished).

        The prompts are sorted by length and cut into groups where padding would cost more than
        another forward (a wave of a server's arrivals is of every length: measured on 32 MT-bench
        first turns at 8 rows on 2 cores, one padded forward per wave spent 8.1 s prefilling and
        grouped forwards 5.1 s, for the same replies)."""
        if not jobs:
            return []
        drained = self._drain()  # a read-ahead step's tokens are taken before the batch changes
        self._unpad()  # newcomers stack under the live rows, not under their ghosts
        groups = [jobs]
        if self._splittable():
            ordered = sorted(jobs, key=lambda j: len(j.prompt))
            overhead = prefill_overhead_tokens(self.decoder.target.device)
            lengths = [len(j.prompt) for j in ordered]
            groups = prefill_groups(ordered, lengths, self.prefill_tokens, overhead)
        return drained + [done for group in groups for done in self._add_group(group)]

    def _plain_at(self, rows: int) -> bool:
        """Whether a batch of `rows` steps plainly (its verify would pass `speculate_up_to`)."""
        return self.speculate_up_to is not None and rows * self.decoder.verify_nodes > self.speculate_up_to

    def _splittable(self) -> bool:
        """Whether newcomers may join in several prefills: each makes its own drafter to merge (a
        drafter object cannot), and a captured verify adopts its batch's cache at the prefill."""
        heads = self.decoder.heads
        return self.decoder.captured is None and (heads is None or _fresh_drafters(heads))

    def _add_group(self, jobs: list[Job]) -> list[Job]:
        """One group's prefill: one forward, or two when only some prompts open with the shared
        prefix and what it saves them outweighs a forward."""
        shared, opens = self._shared([j.prompt for j in jobs])
        inside = [j for j, yes in zip(jobs, opens, strict=True) if yes]
        outside = [j for j, yes in zip(jobs, opens, strict=True) if not yes]
        saves = shared * len(inside)  # prompt tokens the inside rows would not run
        if not outside:
            return self._add(jobs, shared)
        if inside and saves > prefill_overhead_tokens(self.decoder.target.device):
            return self._add(outside, 0) + self._add(inside, shared)
        return self._add(jobs, 0)

    def _add(self, jobs: list[Job], shared: int) -> list[Job]:
        """One prefill of `jobs`, whose prompts all open with the kept prefix's first `shared` tokens."""
        decoder, device = self.decoder, self.decoder.target.device
        if self.state is not None and decoder.heads is not None and not _fresh_drafters(decoder.heads):
            from headstart.errors import HeadstartError

            raise HeadstartError(
                "this drafter object keeps its own rows and cannot take requests joining a running batch",
                "pass heads (a head module), not a drafter",
            )
        pad = decoder.target.tokenizer.pad_token_id or 0
        prompts = prepare_prompts([j.prompt[shared:] for j in jobs], None, pad, 1, None, False, device)
        drafter = make_drafter(decoder.heads, decoder.target.vocab_size, decoder._tree_depth())
        # joining a batch that will step plainly: the prompt's observation waits with the rest
        deferred = Deferred(drafter) if self._defers and self._plain_at(self.live + len(jobs)) else None
        generators = self._generators(jobs)
        start = time.perf_counter()
        abort = (lambda: all(job.cancelled for job in jobs)) if self.abortable else None
        try:
            state = decoder.prefill(prompts, self.sampling, deferred or drafter,
                                    (self.prefix, shared) if shared else None, abort=abort,
                                    generator=generators)  # fmt: skip
        except PrefillAborted:
            for job in jobs:
                job.finish = "cancelled"
            return jobs
        self.prefix_reused += shared * len(jobs)
        self.target_forwards += 1
        self.prefills += 1
        first = state.root.tolist()  # host sync: the prefill's read
        state.rows = list(range(len(self.jobs), len(self.jobs) + len(jobs)))
        for job in jobs:
            job.admitted_s = start
        width = state.visible.shape[1]  # the newcomers' leading columns they do not see, known on the host
        # (after a shared prefix the padding sits between it and each row's rest: none leads)
        lead = [0 if shared else width - len(job.prompt) for job in jobs]
        if self.state is None:
            self.state = state
            if deferred is None:
                self.pending.start(drafter, len(jobs))
            else:
                self.pending.join(deferred.group)
            self.drafter = self.pending.drafter
        else:
            grown = max(self.state.visible.shape[1], width)
            self.lead = [n + grown - self.state.visible.shape[1] for n in self.lead]
            lead = [n + grown - width for n in lead]
            self._merge(state, drafter, deferred)
        self.jobs += jobs
        self.lead += lead
        self._set_generators(generators, len(jobs))
        return self._take([[t] for t in first], [1] * len(first), rows=range(len(self.jobs) - len(jobs), len(self.jobs)),
                          counted=False)  # fmt: skip

    def _shared(self, prompts: list[list[int]]) -> tuple[int, list[bool]]:
        """The shared prefix's length for `prompts` (0 for none) and which of them open with it
        (each with more after it)."""
        if self.prefix is None:
            return 0, [False] * len(prompts)
        ids = self.prefix.pick(prompts)
        n = len(ids)
        return n, [bool(n) and len(p) > n and p[:n] == ids for p in prompts]

    def _merge(self, state: DecodeState, drafter: Any, deferred: Deferred | None) -> None:
        """Stack the newcomers' rows under the live ones (caches left-padded to one width); their
        drafter merges now, or joins as a group of its own when their prefill was deferred."""
        assert self.state is not None
        live = self.state
        width = max(live.visible.shape[1], state.visible.shape[1])
        kv.stack_rows(live.cache, state.cache)
        live.visible = torch.cat([_pad_left(live.visible, width), _pad_left(state.visible, width)])
        live.lengths = torch.cat([live.lengths, state.lengths])
        live.root = torch.cat([live.root, state.root])
        live.rows = list(range(len(self.jobs) + len(state.rows)))
        if deferred is not None:
            self.pending.join(deferred.group)
        else:
            self.drafter = self.pending.merge(drafter, len(state.rows))

    def _generators(self, jobs: list[Job]) -> Any:
        if self.sampling.greedy:
            return None
        device = self.decoder.target.device
        if not self.row_seeds:  # one generator for the batch, seeded by the config (generate)
            seed = self.sampling.seed
            if seed is not None and self._batch_gen is None:
                self._batch_gen = torch.Generator(device=device).manual_seed(seed)
            return self._batch_gen  # made once: later prefill groups go on drawing from it
        gens = []
        for job in jobs:
            gen = torch.Generator(device=device)
            gen.manual_seed(job.seed if job.seed is not None else int(torch.seed()))
            gens.append(gen)
        return RowGenerators(gens)

    def _set_generators(self, newcomers: Any, count: int) -> None:
        """The steps' generator for the merged batch: per-row generators stack; a batch one
        (generate admits every row at once) is kept."""
        current = getattr(self, "_rows_gen", None)
        if isinstance(newcomers, RowGenerators):
            self._rows_gen = (
                newcomers if current is None or len(self.jobs) == count else current.merge(newcomers)
            )
            self.generator = self._rows_gen
        else:
            self._rows_gen = None
            self.generator = newcomers

    # ---- one step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Job]:
        """Drop cancelled rows, then one draft/verify/accept/commit over every live row; returns
        the jobs that finished in it. A decoder's `round_probe` (inference/rounds.py, bench's
        round figures) brackets the whole round."""
        probe = getattr(self.decoder, "round_probe", None)
        with probe.round() if probe is not None else contextlib.nullcontext():
            return self._step()

    def _step(self) -> list[Job]:
        cancelled = [i for i, job in enumerate(self.jobs) if job.cancelled]
        if self._ahead():
            return self._step_ahead(cancelled)
        done = self._drain()  # the batch may have stopped reading ahead (a row joined)
        done += self._leave([i for i, job in enumerate(self.jobs) if job.cancelled], "cancelled")
        if not self.jobs:
            return done
        self._pad()
        return done + self._step_now()

    def _step_now(self, program: bool = True) -> list[Job]:
        """One round over the live rows, read at once (`program`: try the round program first)."""
        decoder, state = self.decoder, self.state
        assert state is not None
        plain = self._plain_at(len(self.jobs)) or (
            decoder.positions.limited  # most targets: no per-step lengths to gather
            and decoder.must_step_plainly([len(j.prompt) + len(j.emitted) for j in self.jobs])
        )
        contexts = (
            [j.prompt + j.emitted for j in self.jobs] if decoder.tree.reads_context and not plain else None
        )
        if contexts is not None:  # a ghost looks up what the row it copies looks up
            contexts += [contexts[0]] * self.ghosts
        if program and not plain and contexts is None:  # the whole round as one program, where it can run
            with region("headstart.captured"):
                self.drafter = self.pending.flush()
                taken = decoder.round(state, self.sampling, self.drafter, self.generator)
            if taken is not None:
                self.target_forwards += 1
                live = len(self.jobs)  # the ghosts' tokens are dropped
                return self._take(taken[0][:live], taken[1][:live], rows=range(live), counted=True)
        # a round the program could have run draws what the program would have drawn
        generator = self.generator if plain or contexts is not None else \
            decoder.program_draws(state.root.shape[0], self.sampling, self.generator)  # fmt: skip
        # the step's phases are named for profilers (scripts/gpu/check.py --profile); cost: ~1 us each
        with region("headstart.draft"):
            if not plain:  # what plain steps committed and deferred prompts, one observe a group
                self.drafter = self.pending.flush()
            drafter = self.drafter
            tree = decoder.draft(state, self.sampling, drafter, contexts, plain=plain, generator=generator)
        self.plain_steps += int(plain)
        with region("headstart.verify"):
            feats = decoder.verify(state, tree, drafter)
            if hasattr(drafter, "verified"):  # Lookahead: its window's next level is in these logits
                drafter.verified(tree, feats.logits)
        if not plain:  # a plain step drafted nothing to forget (a deferred group's drafter holds no rows)
            drafter.end_step()
        self.target_forwards += 1
        with region("headstart.accept"):
            acc = decoder.accept(tree, feats, self.sampling, generator)
        observer = self.pending if plain and self._defers else drafter
        with region("headstart.commit"):  # its one host sync, the cache compaction, the observe
            committed, counts = decoder.commit(state, tree, feats, acc, observer)
        if plain and self._defers:
            self.pending.feed_over(self.pending_limit)
        live = len(self.jobs)  # the ghosts' tokens are dropped
        return self._take(committed[:live], counts[:live], rows=range(live), counted=True)

    # ---- reading ahead (plain decoding) -----------------------------------------------------------
    def _ahead(self) -> bool:
        """Whether this step reads ahead: asked for, and either plain decoding (a root-only tree,
        no drafter) with no batch generator shared by several rows (a row that stopped would
        still draw from it in the step after its stop, moving the other rows' seeded draws), or
        the round program (inference/captured_round.py: it knows its widths before it runs;
        under sampling, the same rule on generators) where no step must be plain
        (speculate_up_to, a learned position table: those are decided by lengths the host has
        not read yet)."""
        decoder = self.decoder
        if not self.read_ahead:
            return False
        if decoder.heads is None and decoder.verify_nodes == 1:
            return self._draws_own()
        return self._rounds_ahead()

    def _draws_own(self) -> bool:
        """Every row's draws are its own (greedy, per-row generators, or one row): a step queued
        past a row's stop moves no other row's draws."""
        return self.sampling.greedy or self.row_seeds or self.live == 1

    def _rounds_ahead(self) -> bool:
        decoder = self.decoder
        return (
            decoder.program_for(self.sampling)
            and self._draws_own()
            and not decoder.tree.reads_context
            and not decoder.positions.limited
            and not self._plain_at(self.live)
        )

    def _step_ahead(self, cancelled: list[int]) -> list[Job]:
        """Queue this step, then take the previous one's tokens; a step is not queued when every
        row ends by length with the tokens already on their way (the host counts them)."""
        done = []
        if cancelled:  # rows leave between reads: the unread tokens are taken first
            done = self._drain()
            done += self._leave([i for i, job in enumerate(self.jobs) if job.cancelled], "cancelled")
        if not self.jobs:
            return done
        self._pad()
        pending = 1 if self.unread is not None else 0  # at least one token a row is on its way
        if not any(len(j.emitted) + pending < j.rule.max_new_tokens for j in self.jobs):
            return done + self._drain()
        if not self._rounds_ahead():
            return done + self._drain(self._queue_plain())
        with region("headstart.captured"):
            self.drafter = self.pending.flush()
            report = self.decoder.round_unread(self.state, self.sampling, self.drafter, self.generator)
        if report is None:  # the program cannot run this round: read what is queued, then the steps
            done += self._drain()
            return done + (self._step_now(program=False) if self.jobs else [])
        self.target_forwards += 1
        return done + self._drain(Unread.queue(report, self.jobs, counted=True))

    def _queue_plain(self) -> Unread:
        """One plain step queued, its token left on the device (the host knows its width)."""
        decoder, state = self.decoder, self.state
        assert state is not None
        with region("headstart.draft"):
            tree = decoder.draft(
                state, self.sampling, self.drafter, None, plain=True, generator=self.generator
            )
        self.plain_steps += 1
        with region("headstart.verify"):
            feats = decoder.verify(state, tree, self.drafter)
        self.target_forwards += 1
        with region("headstart.accept"):
            acc = decoder.accept(tree, feats, self.sampling, self.generator)
        with region("headstart.commit"):  # no read: the host knows the widths
            return Unread.queue(decoder.commit_unread(state, tree, feats, acc, self.drafter), self.jobs)

    def _drain(self, then: Unread | None = None) -> list[Job]:
        """Take the unread step's tokens (waiting only for that step's copy), then keep `then`
        as the step to read next."""
        unread, self.unread = self.unread, then
        if unread is None:
            return []
        if unread.ready is not None:
            unread.ready.synchronize()
        tokens = self.decoder._read_step(unread.tokens)  # the step's one read (counted as such)
        row = {id(job): i for i, job in enumerate(unread.jobs)}
        # every live job was queued in it: rows join only after a drain, and leave by one
        committed = [tokens[row[id(job)]] for job in self.jobs]
        counts = [1] * len(committed)
        if unread.counted:
            committed, counts = unpack_report(committed)
        finished = self._take(committed, counts, rows=range(len(self.jobs)), counted=True)
        if not self.jobs:
            self.unread = None
        return finished

    def _take(self, committed: list[list[int]], counts: list[int], rows: range, counted: bool) -> list[Job]:
        """Each row's tokens up to its stop; streams them; finished rows leave."""
        now = time.perf_counter()
        finished = []
        for row, tokens, count in zip(rows, committed, counts, strict=True):
            job = self.jobs[row]
            before = len(job.emitted)
            done = job.rule.take(job.emitted, tokens[:count], job.stop_context)
            new = job.emitted[before:]
            if counted:
                job.steps += 1
                job.committed += len(new)
                self.stats.row_steps += 1
                self.stats.committed += len(new)
                self.stats.accept_lengths[count] += 1
                bucket = self.stats.by_position.setdefault(
                    position_bucket(len(job.prompt) + before), [0, 0, 0]
                )
                bucket[0], bucket[1], bucket[2] = bucket[0] + 1, bucket[1] + count, bucket[2] + (count > 1)
            if new and job.first_token_s is None:
                job.first_token_s = now
            if new and job.on_tokens is not None:
                job.on_tokens(new)
            if done:
                last = job.emitted[-1] if job.emitted else None
                job.finish = "length" if len(job.emitted) >= job.rule.max_new_tokens and last not in \
                    job.rule.eos_token_ids else "stop"  # fmt: skip
                finished.append(row)
        return self._leave(finished, None)

    def _leave(self, rows: list[int], reason: str | None) -> list[Job]:
        """Drop `rows` from the batch (a host-to-device copy of the kept indices, only then); the
        ghosts go with them (`_pad` adds them back before the next round)."""
        if not rows:
            return []
        gone = set(rows)
        left = [self.jobs[i] for i in rows]
        for job in left:
            if reason is not None:
                job.finish = reason
        keep = [i for i in range(len(self.jobs)) if i not in gone]
        self.jobs = [self.jobs[i] for i in keep]
        self.lead = [self.lead[i] for i in keep]
        if not keep:
            self.state, self.drafter, self._rows_gen, self.unread = None, None, None, None
            self.pending.clear()
            self.ghosts = 0
            return left
        self._keep_rows(keep)
        self._trim()
        return left

    def _keep_rows(self, keep: list[int], ghosts: int = 0) -> None:
        """The batch's rows become `keep` (ascending), then `ghosts` copies of the first: the
        state, the drafter, the rows' generators (a ghost draws from one of its own)."""
        assert self.state is not None
        device = self.state.root.device
        order = keep + [keep[0]] * ghosts
        index = torch.tensor(order, dtype=torch.long, device=device)
        self.drafter = self.pending.flush() if ghosts else self.drafter  # one group to copy a row of
        self.state.select_rows(index, order)
        self.pending.select_rows(order, device)  # each row group's drafter keeps its rows
        self.drafter = self.pending.drafter
        if self._rows_gen is not None:
            kept = self._rows_gen.select(keep)
            spare = [torch.Generator(device=device).manual_seed(i) for i in range(ghosts)]
            self._rows_gen = kept.merge(RowGenerators(spare)) if ghosts else kept
            self.generator = self._rows_gen
        self.ghosts = ghosts

    def _pad(self) -> None:
        """Pad the live batch up to its bucket with ghosts (`batch_buckets`) where a ghost cannot
        change what a live row gets: greedy or per-row generators (a batch generator's draws
        would move), and no learned position table (a ghost's lengths are not checked)."""
        live = len(self.jobs)
        if not self.batch_buckets or self.ghosts or not live or self.decoder.positions.limited:
            return
        if not (self.sampling.greedy or self.row_seeds):
            return
        size = next((b for b in self.batch_buckets if b >= live), live)
        if size > live:
            self._keep_rows(list(range(live)), size - live)

    def _unpad(self) -> None:
        """Drop the ghosts (before the batch changes)."""
        if self.ghosts and self.jobs:
            self._keep_rows(list(range(len(self.jobs))))

    def _trim(self) -> None:
        """Cut the left columns no live row sees: padding of a wider prompt that left (its width
        is tracked on the host: no device read)."""
        assert self.state is not None
        first = min(self.lead)
        if first:
            kv.drop_left(self.state.cache, first)
            self.state.visible = self.state.visible[:, first:]
            self.lead = [n - first for n in self.lead]


def _pad_left(mask: torch.Tensor, width: int) -> torch.Tensor:
    if mask.shape[1] == width:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], width - mask.shape[1]), mask], dim=1)


def _fresh_drafters(heads: Any) -> bool:
    """make_drafter builds a new drafter per call for head modules (not for a drafter object)."""
    return not isinstance(heads, Drafter)


def region(name: str) -> Any:
    """A named range in a running profiler's trace (scripts/gpu/check.py --profile); nothing
    otherwise (a record_function costs a dispatcher call: ~3 us a phase, 0.3% of a captured step)."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
