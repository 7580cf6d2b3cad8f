"""What a decode's speed depends on besides the code: the machine, named so that a tune or a
calibration measured on one machine is not trusted on another, and how much of it is free (the
threads a command uses on a machine other processes share)."""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "sve", "asimd")
"""The instruction sets the CPU kernels (torch's, headstart's small-row kernel) use."""


def machine(device: str) -> str:
    """What a decode's speed depends on besides the code: the GPU's name, or the CPU model with the
    instruction sets the kernels use (the same model name can hide AMX or not on a VM)."""
    if device.startswith("cuda"):
        import torch

        return f"cuda:{torch.cuda.get_device_name()}"
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
            if model and flags:
                break
    except OSError:
        pass
    return f"cpu:{model} [{' '.join(f for f in ISA_FLAGS if f in flags)}]"


# ---- sharing the machine: threads from the cores actually free, passive waiting under load ----
BUSY_SAMPLE_S = 0.1
"""How long the other processes' load is sampled at start-up (from /proc/stat: 10 kernel ticks a
core at 100 Hz, enough to tell a busy core from an idle one; a cost every command pays once)."""


@dataclass(frozen=True)
class Sharing:
    """What a command decided about threads before torch was imported (`share_machine`)."""

    cores: int
    """Cores this process may run on: its affinity, capped by a cgroup CPU quota."""
    busy: float
    """Cores' worth of work other processes did while sampled (0.0 when unreadable)."""
    threads: int | None
    """The thread count chosen (None: the user chose, by OMP_NUM_THREADS or --threads)."""
    passive: bool
    """Whether idle OpenMP threads sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE set here)."""

    def note(self) -> str:
        """One line for stderr when the machine is shared, else ''."""
        if self.busy < BUSY_CORE:
            return ""
        chose = f"{self.threads} thread(s)" if self.threads is not None else "the threads you set"
        return (
            f"note: other processes keep ~{self.busy:.1f} of this machine's {self.cores} core(s) busy: "
            f"{chose}{', waiting passively' if self.passive else ''} (--threads N chooses the count)"
        )


BUSY_CORE = 0.5
"""Other processes' load (in cores) from which a core counts as taken and threads wait passively:
two busy 2-thread processes on 2 cores slowed each other 25-45x while their OpenMP threads spun
(2026-11), a 48-token generate with one core busy 3.1x (2026-12-02)."""


def share_machine(environ: Any = None, busy: float | None = None, threads_given: bool = False) -> Sharing:
    """Decide, before torch (and its OpenMP runtime, which reads these variables once at load) is
    imported, how many threads to use and whether idle ones may spin: every core this process may
    use that no other process keeps busy, at least one; passive waiting when other processes load
    the machine (a spinning thread then holds a core the other process needs, and waits for a
    teammate the scheduler has set aside). The user's OMP_NUM_THREADS and OMP_WAIT_POLICY (or
    GOMP_SPINCOUNT) win, as does `threads_given` (the command's --threads). `busy`: the other
    processes' load in cores (measured when None)."""
    env = os.environ if environ is None else environ
    cores = usable_cores()
    load = other_load(cores) if busy is None else busy
    taken = int(load + 1 - BUSY_CORE)  # a core counts as taken from BUSY_CORE of a core's load
    threads: int | None = None
    if not (env.get("OMP_NUM_THREADS") or threads_given):
        threads = max(1, min(cores, physical_cores()) - taken)  # torch's own default: the physical cores
        if taken:  # an idle machine keeps torch's default (and children inherit nothing)
            env["OMP_NUM_THREADS"] = str(threads)
    passive = False
    if load >= BUSY_CORE and not (env.get("OMP_WAIT_POLICY") or env.get("GOMP_SPINCOUNT")):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        passive = True
    global SHARED
    SHARED = Sharing(cores=cores, busy=load, threads=threads, passive=passive)
    return SHARED


SHARED: Sharing | None = None
"""What `share_machine` decided in this process (None: it did not run), said once by `say_sharing`."""


def say_sharing(log: Any) -> None:
    """The sharing note, once a process, when its work begins (a target has loaded), as an
    information line (-q hides it): an error in the arguments stays one line."""
    global SHARED
    if SHARED is not None and SHARED.note():
        log.info(SHARED.note())
    SHARED = None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    (a container given 2 CPUs of a 64-core host sees 64 in its affinity)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def physical_cores() -> int:
    """The physical cores among the CPUs this process may use (SMT siblings counted once), as
    torch's default thread count counts them; every CPU where the topology is unreadable."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    seen = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            seen.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            seen.add(("", str(cpu)))
    return max(1, len(seen))


def other_load(cores: int, sample_s: float = BUSY_SAMPLE_S) -> float:
    """Cores' worth of work the other processes did over `sample_s` on the CPUs this process may
    use (/proc/stat's per-CPU ticks, less this process's own), capped at `cores`; 0.0 where
    /proc/stat is unreadable (not Linux). Cost: `sample_s` of sleep."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before, own_before, start = _busy_ticks(mine), _own_seconds(), time.monotonic()
    if before is None:
        return 0.0
    time.sleep(sample_s)
    after, own_after, wall = _busy_ticks(mine), _own_seconds(), time.monotonic() - start
    if after is None or wall <= 0:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = (after - before) / ticks - (own_after - own_before)
    return round(min(float(cores), max(0.0, busy / wall)), 2)


def _busy_ticks(cpus: list[int] | None) -> int | None:
    """Non-idle ticks summed over `cpus` (all when None) from /proc/stat; None when unreadable."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted = None if cpus is None else {f"cpu{c}" for c in cpus}
    total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or (wanted is not None and name not in wanted):
            continue
        values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(values) - values[3] - values[4] - values[7]  # less idle, iowait and steal
    return total


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system
