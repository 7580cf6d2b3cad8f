"""What one steady-state speculative round costs, counted: host reads, calls into compiled code,
eager aten ops outside it, and milliseconds (`headstart bench`'s `round` figures, per method).

On a GPU at batch 1 a small target's round is launch-bound: the counts say where the time goes
before any clock does (the fastest engines run a round as ~3 graph replays and a few kernels with
no blocking read: docs/../shared DESIGN "A round on a GPU"). Counted on any device:

* host_reads: values read back to the host by Python (`.item()`, `.tolist()`, `bool(t)`,
  `int(t)`, `.cpu()`, `.numpy()`, a boolean-mask index, `nonzero`), by a counting shim on
  torch.Tensor active only inside the rounds (as tests/inference/test_host_syncs.py counts);
* compiled_calls: "Torch-Compiled Region" events (one per call of a torch.compile'd function);
* eager_ops: top-level aten ops outside any compiled region (the profiler's CPU events), and
  `eager_by_phase`: the same split by the engine's named phases (draft, verify, accept, commit;
  "other" outside them), the map of what a captured round must absorb;
* ms: wall time per round, from an unprofiled pass (rounds start to start).

One prompt is decoded three times: a warm-up (compiles, packs), a timed pass, a profiled pass;
the first `SKIP` rounds of each pass are left out (the first steps warm caches and buckets)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
SKIP = 1
ROUND = "headstart.round"
COMPILED = "Torch-Compiled Region"


class Probe:
    """The engine's per-round hook (`decoder.round_probe`): each round's start time and reads."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.reads: list[int] = []
        self.active = False

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        self.starts.append(time.perf_counter())
        self.reads.append(0)
        self.active = True
        try:
            with torch.profiler.record_function(ROUND):
                yield
        finally:
            self.active = False

    def read(self) -> None:
        if self.active:
            self.reads[-1] += 1


@contextlib.contextmanager
def counting_reads(probe: Probe) -> Iterator[None]:
    """torch.Tensor's host-reading methods counted into `probe` while this runs (then restored)."""
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    getitem, nonzero = torch.Tensor.__getitem__, torch.nonzero

    def wrap(name: str) -> Any:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            probe.read()
            return originals[name](self, *args, **kwargs)

        return counted

    def indexed(self: torch.Tensor, index: Any) -> Any:  # a boolean mask index reads its count back
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            probe.read()
        return getitem(self, index)

    def counted_nonzero(*args: Any, **kwargs: Any) -> Any:
        probe.read()
        return nonzero(*args, **kwargs)

    try:
        for name in READS:
            setattr(torch.Tensor, name, wrap(name))
        torch.Tensor.__getitem__ = indexed  # type: ignore[method-assign]
        torch.nonzero = counted_nonzero  # type: ignore[assignment]
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        torch.Tensor.__getitem__ = getitem  # type: ignore[method-assign]
        torch.nonzero = nonzero  # type: ignore[assignment]


def measure_rounds(decoder: Any, prompt: list[int], sampling: Any) -> dict[str, Any] | None:
    """The steady-state round of `decoder` on `prompt`: {"rounds", "host_reads", "compiled_calls",
    "eager_ops", "ms"} (per-round means over the steady rounds) and "max" (each count's largest
    round); None when the reply left no steady round (it ended within SKIP + 1 rounds)."""
    decoder.generate([prompt], sampling=sampling)  # warm-up: compiles, packs, allocates
    timed = _pass(decoder, prompt, sampling)
    if len(timed.starts) <= SKIP + 1:
        return None
    ms = 1000 * statistics.mean(
        b - a for a, b in zip(timed.starts[SKIP:], timed.starts[SKIP + 1 :], strict=False)
    )
    counted = Probe()
    with (
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        counting_reads(counted),
    ):
        _pass(decoder, prompt, sampling, counted)
    compiled, eager, phases = _per_round(prof.events())
    rows = [
        {"host_reads": reads, "compiled_calls": compiled[i], "eager_ops": eager[i], "phases": phases[i]}
        for i, reads in enumerate(counted.reads)
    ][SKIP:]
    rows = rows[:-1] or rows  # the last round is cut short by the stop
    figures: dict[str, Any] = {"rounds": len(rows), "ms": round(ms, 3)}
    for key in ("host_reads", "compiled_calls", "eager_ops"):
        figures[key] = round(statistics.mean(row[key] for row in rows), 2)
    figures["max"] = {
        key: max(row[key] for row in rows) for key in ("host_reads", "compiled_calls", "eager_ops")
    }
    # where the eager ops are: the engine's named phases (engine.region), "other" outside them
    figures["eager_by_phase"] = {
        phase: round(statistics.mean(row["phases"].get(phase, 0) for row in rows), 2)
        for phase in sorted({p for row in rows for p in row["phases"]})
    }
    return figures


def _pass(decoder: Any, prompt: list[int], sampling: Any, probe: Probe | None = None) -> Probe:
    probe = probe or Probe()
    decoder.round_probe = probe
    try:
        decoder.generate([prompt], sampling=sampling)
    finally:
        decoder.round_probe = None
    return probe


def _per_round(events: Any) -> tuple[list[int], list[int], list[dict[str, int]]]:
    """(compiled calls, eager ops, eager ops by phase) per ROUND event, in round order, from the
    profiler's events; a phase is the innermost of the engine's "headstart.<phase>" ranges."""
    rounds = sorted((e for e in events if e.name == ROUND), key=lambda e: e.time_range.start)
    index = {id(e): i for i, e in enumerate(rounds)}
    compiled, eager = [0] * len(rounds), [0] * len(rounds)
    phases: list[dict[str, int]] = [{} for _ in rounds]
    for event in events:
        top_aten, in_compiled, owner, phase = event.name.startswith("aten::"), False, None, None
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                top_aten = False
            if parent.name.startswith(COMPILED):
                in_compiled = True
            if parent.name == ROUND:
                owner = index.get(id(parent))
            elif phase is None and parent.name.startswith("headstart."):
                phase = parent.name.removeprefix("headstart.")
            parent = parent.cpu_parent
        if owner is None:
            continue
        if event.name.startswith(COMPILED) and not in_compiled:
            compiled[owner] += 1
        elif top_aten and not in_compiled:
            eager[owner] += 1
            key = phase or "other"
            phases[owner][key] = phases[owner].get(key, 0) + 1
    return compiled, eager, phases
