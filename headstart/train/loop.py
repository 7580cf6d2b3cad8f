"""The one training loop: accelerator.prepare / accumulate, held-out metrics, checkpoints, resume."""

from __future__ import annotations

import logging
import math
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headstart import kinds
from headstart.config import to_dict
from headstart.interrupts import StopRequest, stop_at_step_end
from headstart.logs import progress_off
from headstart.provenance import portable, stamp
from headstart.train import checkpoints, metrics
from headstart.train.config import TrainConfig
from headstart.train.data import Conversations, EpochSampler, Packed, TrainData, collate
from headstart.train.heap import trim_heap
from headstart.train.objective import Objective
from headstart.train.setup import add_lora, make_accelerator, make_head, make_optimizer, plan


def check_finite(loss: float, step: int, ckpt_root: Any) -> None:
    """Stop at the first logged non-finite loss (read at the log's own sync: no extra one)
    instead of training on NaN for hours; the last good checkpoint stays."""
    if math.isfinite(loss):
        return
    from headstart.errors import HeadstartError

    saved = checkpoints.checkpoints(ckpt_root)
    raise HeadstartError(
        f"the training loss is {loss} at step {step}"
        + (f" (last good checkpoint {saved[-1]})" if saved else ""),
        "check the data's cached features for inf (distill with --feature-dtype bfloat16) or lower optim.lr",
    )


def _dataset(p: Any, indices: list[int], train: bool) -> Any:
    """The conversations at `indices`; training rows packed where data.pack says so (the
    objective's `pack_margin`: how far ahead of a query its labels reach)."""
    conversations = Conversations(p.data, indices, p.cfg.data.max_length)
    if not (train and p.cfg.data.pack):
        return conversations
    margin = getattr(kinds.load(kinds.get(p.cfg.head.kind).objective), "pack_margin", None)
    if margin is None:
        from headstart.errors import HeadstartError

        raise HeadstartError(
            f"data.pack={p.cfg.data.pack}: head.kind={p.cfg.head.kind} trains one conversation a row "
            "(its objective does not keep packed conversations apart)",
            "set data.pack=0, or train a kind that packs (eagle3)",
        )
    return Packed(conversations, p.cfg.data.pack, margin(p.cfg))


def _loader(p: Any, dataset: Any, sampler: Any, batch_size: int, drop_last: bool, train: bool = False) -> Any:
    pad = p.target.tokenizer.pad_token_id or 0
    # a kind's training step may read its indices from a plan made here, on the host, by the
    # collate (EAGLE-3: train/objectives/eagle/plan.py): its objective's `planner`
    plan_for = getattr(kinds.load(kinds.get(p.cfg.head.kind).objective), "planner", None)
    planner = plan_for(p.cfg) if train and plan_for is not None else None
    # An own generator: otherwise every new iterator draws its base seed from the global RNG, and a
    # resumed run (which starts a fresh iterator mid-epoch) would shift the noise of EAGLE-1.
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        collate_fn=lambda items: collate(items, pad, planner),
        # pinned host batches copy to a GPU without blocking (accelerate's non_blocking, setup.py):
        # the host collates the next batch while the device runs the step
        pin_memory=torch.device(p.target.device).type == "cuda",
        generator=torch.Generator().manual_seed(p.cfg.seed),
    )


def train(
    cfg: TrainConfig,
    data: TrainData | None = None,
    resume: bool = False,
    target: Any = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Train a head as `cfg` says; returns the run summary also written to output_dir/results.json.
    `command` (the CLI line that ran it) goes into the summary and the model card, so a head says
    how to rebuild it."""
    from tqdm.auto import tqdm

    from headstart.io import lock_dir
    from headstart.outputs import check_output_dir

    started = clock()  # the time budget counts start-up too
    check_output_dir(cfg.output_dir, "output_dir")  # before any data or model loads
    check_run_dir(Path(cfg.output_dir), resume)
    if resume:
        checkpoints.check_same_run(to_dict(cfg), Path(cfg.output_dir) / "checkpoints")
    # one run per output_dir (the main process of a launch holds it; the others share its files)
    out = Path(cfg.output_dir)
    created = not out.exists()
    lock = lock_dir(out, "headstart train") if os.environ.get("RANK", "0") == "0" else None
    try:
        with stop_at_step_end() as stop:
            return _train(cfg, data, resume, target, tqdm, command, Budget(cfg.time_budget_s, started), stop)
    finally:
        if lock is not None:
            lock.close()
            if created and [p.name for p in out.iterdir()] == [".lock"]:  # failed before writing
                (out / ".lock").unlink()
                out.rmdir()


def clock() -> float:
    """The run's clock (time.perf_counter): the time budget, the pace and the log's step times
    read it, and tests give it steps of their own (a budget decided by a loaded machine's clock
    would make them pass or fail by chance)."""
    return time.perf_counter()


RUN_FILES = {"checkpoints", "final", "final-lora", "logs", "results.json"}
"""What a training run writes in its output_dir (and nothing else)."""


def check_run_dir(out: Path, resume: bool) -> None:
    """output_dir is new, empty or a headstart run: a directory of other files is not written
    into (its `final/` or `logs/` would be replaced), and a finished run is not trained over
    without --resume."""
    from headstart.errors import HeadstartError

    if out.exists() and not out.is_dir():
        raise HeadstartError(
            f"output_dir {out} is a file", "set output_dir to a directory path (new or empty)"
        )
    names = {p.name for p in out.iterdir() if not p.name.startswith(".")} if out.is_dir() else set()
    if names and not names & RUN_FILES:
        shown = ", ".join(sorted(names)[:4]) + (" ..." if len(names) > 4 else "")
        raise HeadstartError(
            f"output_dir {out} is not empty ({shown}) and holds no headstart training run",
            "set output_dir to a new or empty directory",
        )
    if not resume and names & {"final", "results.json"}:
        raise HeadstartError(
            f"{out} already holds a finished training run",
            "pass --resume (with a higher max_steps to train on), or set output_dir to a new directory",
        )
    if resume and not checkpoints.checkpoints(out / "checkpoints"):
        finished = sorted(names & {"final", "results.json"})
        raise HeadstartError(
            f"--resume: {out} holds no checkpoint to continue from"
            + (f" (only a finished run's {', '.join(finished)})" if finished else ""),
            f"train on from its head with init_from={out / 'final'} and a new output_dir"
            if finished
            else "drop --resume to start a new run there",
        )


class Budget:
    """When a time-budgeted run must stop: before the next step (with an evaluation or a
    checkpoint due then, their last cost too) and the checkpoint that ends the run would pass
    the deadline. The step clock starts when start-up ends (`ready`), and the first step, which
    pays the warm-up (allocator, kernels, compiles), counts only until a second one is timed;
    after that a step costs the longest seen since (step times wander on a shared machine)."""

    def __init__(self, seconds: float, started: float) -> None:
        self.started = started
        self.deadline = started + seconds if seconds > 0 else None
        self.step_s = self.eval_s = self.save_s = 0.0
        self.steps = 0
        self.stepping_s = 0.0  # the steps' own time after the first (the pace of a timed decay)
        self.last = self.ready_at = clock()

    def ready(self) -> None:
        """Start-up is over: the next step is timed from now, not from the process start."""
        self.last = self.ready_at = clock()

    def stepped(self) -> None:
        now = clock()
        took, self.last = now - self.last, now
        self.steps += 1
        self.step_s = took if self.steps <= 2 else max(self.step_s, took)
        if self.steps >= 2:
            self.stepping_s += took

    def decay_steps(self, share: float) -> int:
        """optim.schedule=wsd under a deadline: 0 while more than `share` of the training time is
        left; then the steps the mean pace fits into what is left (the final evaluation and
        checkpoint set aside), over which the learning rate decays to 0."""
        if self.deadline is None or self.steps < 3:
            return 0
        now = clock()
        # what `exhausted` keeps back, so that the decay ends before the budget would stop the run
        left = self.deadline - now - (1.1 * (self.step_s + self.eval_s) + 2 * self.save_s + 1.0)
        if left > share * (self.deadline - self.ready_at):
            return 0
        return max(1, int(left / (1.1 * self.stepping_s / (self.steps - 1))))

    def timed(self, kind: str, since: float) -> None:
        """Record how long an evaluation or a checkpoint took (and restart the step clock)."""
        now = clock()
        setattr(self, f"{kind}_s", max(getattr(self, f"{kind}_s"), now - since))
        self.last = now

    def exhausted(self, evaluates_next: bool) -> bool:
        if self.deadline is None:
            return False
        # a 10% margin on the estimate: step times wander on a shared machine
        need = 1.1 * (self.step_s + (self.eval_s if evaluates_next else 0.0)) + 2 * self.save_s + 1.0
        return clock() + need > self.deadline


class Pace:
    """Train steps' wall time and real tokens since the last log (evaluations and checkpoints
    left out), for the log's step-time table: `step_s` and `tokens_per_s` in each train entry.
    cost: the token count is summed on the device and read at the log's own sync."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.restart()

    def restart(self) -> None:
        self.since, self.steps = clock(), 0
        self.tokens = torch.zeros((), dtype=torch.long, device=self.device)

    def add(self, lengths: torch.Tensor, stepped: bool) -> None:
        """A micro-batch's real tokens; `stepped`: it ended an optimizer step."""
        self.tokens += lengths.sum()
        self.steps += int(stepped)

    def read(self, accelerator: Any) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the window's kernels are part of its time
        seconds = clock() - self.since
        tokens = float(accelerator.reduce(self.tokens.clone(), "sum").item())  # every process's
        out = {
            "step_s": round(seconds / max(self.steps, 1), 4),
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
        }
        self.restart()
        return out


@dataclass
class _Run:
    """One training run's live state, what the loop's phases share (_start makes it)."""

    cfg: TrainConfig
    accelerator: Any
    p: Any  # the plan: target, data, splits, head summary (train/setup.py)
    model: Any
    optimizer: Any
    scheduler: Any
    train_loader: Any
    eval_loader: Any
    out: Path
    state: dict[str, Any]  # what the resumed checkpoint held ({} for a fresh run)
    step: int
    tokens: torch.Tensor  # this process's real tokens, on the device: no sync per step
    history: list[dict[str, Any]]
    budget: Budget
    stop: StopRequest
    end: int  # the last step: max_steps, or where a wsd decay the time budget placed ends
    timed_decay: bool
    bar: Any = None
    pace: Any = None
    window: list[torch.Tensor] = field(default_factory=list)  # detached losses since the last log
    parts_window: list[torch.Tensor] = field(default_factory=list)
    saved_at: Any = None

    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"


def _train(
    cfg: TrainConfig, data: TrainData | None, resume: bool, target: Any, tqdm: Any, command: str | None,
    budget: Budget, stop: StopRequest,
) -> dict[str, Any]:  # fmt: skip
    run = _start(cfg, data, resume, target, budget, stop)
    epoch, skip = divmod(run.step * cfg.grad_accum, len(run.train_loader))
    run.bar = tqdm(
        total=run.end,
        initial=run.step,
        disable=not run.accelerator.is_local_main_process
        or progress_off(),  # an explicit disable ignores TQDM_DISABLE
        desc=f"train {cfg.head.kind}",
    )
    start = clock()
    budget.ready()
    run.pace = Pace(run.accelerator.device)  # the log's step-time table: wall time and tokens per window
    run.model.train()
    stop.armed = True  # from here a signal stops the run after its current step
    try:
        while run.step < run.end:
            batches = run.accelerator.skip_first_batches(run.train_loader, skip) if skip else run.train_loader
            # accelerate's loaders re-seed the sampler from their own pass counter at every __iter__;
            # pin it to our epoch so a resumed run (a fresh loader) replays the same order.
            batches.set_epoch(epoch)
            skip = 0
            for batch in batches:
                joint = cfg.lora.enabled and run.step >= cfg.lora.warmup_steps
                if not _micro_step(run, batch, joint):
                    continue
                stopped = _after_step(run, joint)
                if stopped is not None:
                    return stopped
                if run.step >= run.end:
                    break
            epoch += 1
    except KeyboardInterrupt:  # a second Ctrl-C (or SIGTERM): at once, from inside a step
        run.bar.close()
        raise _stopped_at_once(run) from None
    finally:
        stop.armed = False  # the final evaluation and save: a signal interrupts them at once
    run.bar.close()
    return _finish(run, start, command)


def _start(cfg: TrainConfig, data: TrainData | None, resume: bool, target: Any, budget: Budget,
           stop: StopRequest) -> _Run:  # fmt: skip
    """The accelerator, head, optimizer, loaders and resumed state of a run, trackers started."""
    from headstart.errors import HeadstartError

    if not resume and checkpoints.checkpoints(Path(cfg.output_dir) / "checkpoints"):
        raise HeadstartError(
            f"{cfg.output_dir} already holds checkpoints of an earlier run",
            "pass --resume to continue it, or set output_dir to a new directory",
        )
    accelerator = make_accelerator(cfg)
    p = plan(cfg, device=str(accelerator.device), data=data, target=target)
    head = make_head(p)
    lora = cfg.lora.enabled
    target_model = add_lora(cfg, p.target.model) if lora else p.target.model
    model = Objective(head, target_model, cfg, trainable_target=lora)
    optimizer, scheduler = make_optimizer(
        cfg, [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    )
    train_set = _dataset(p, p.train_idx, train=True)
    lengths = (
        train_set.lengths
        if isinstance(train_set, Packed)
        else [train_set.length(i) for i in range(len(train_set))]
    )
    # Grouped by the batch of all processes together: accelerate hands process r the r-th of each
    # run of num_processes consecutive batches, so N processes see the conversations one process
    # with N times the batch would (tests/train/test_train_distributed.py).
    global_batch = cfg.batch_size * accelerator.num_processes
    sampler = EpochSampler(len(train_set), cfg.seed, lengths, global_batch, cfg.data.group_by_length)
    train_loader = _loader(p, train_set, sampler, cfg.batch_size, drop_last=True, train=True)
    eval_loader = (
        _loader(p, _dataset(p, p.eval_idx, train=False), None, cfg.batch_size, drop_last=False)
        if p.eval_idx
        else None
    )
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    if eval_loader is not None:
        eval_loader = accelerator.prepare(eval_loader)
    # Not prepared: accelerate would step it once per process; registered so it is checkpointed.
    accelerator.register_for_checkpointing(scheduler)
    out = Path(cfg.output_dir)
    state = (
        checkpoints.load_checkpoint(accelerator, out / "checkpoints") if resume else {}
    )  # check_run_dir: one exists
    if accelerator.is_main_process:
        # wandb writes its run folder into the working directory unless told: under the run's logs/
        wandb_dir = {"wandb": {"dir": str(out / "logs")}} if "wandb" in cfg.trackers else {}
        if wandb_dir:
            (out / "logs").mkdir(parents=True, exist_ok=True)
        accelerator.init_trackers(
            cfg.tracker_project, config=metrics.flat_config(to_dict(cfg)), init_kwargs=wandb_dir
        )
    if len(train_loader) == 0:
        raise HeadstartError(
            "the training split is smaller than one global batch", "lower batch_size or add data"
        )
    logging.getLogger("headstart.train").info(
        "head and optimizer ready: start-up took %.1f s", clock() - budget.started
    )
    return _Run(
        cfg, accelerator, p, model, optimizer, scheduler, train_loader, eval_loader, out, state,
        step=int(state.get("step", 0)),
        tokens=torch.tensor(float(state.get("tokens", 0.0)), device=accelerator.device),
        history=list(state.get("history", [])), budget=budget, stop=stop,
        end=getattr(scheduler, "end_step", cfg.max_steps),  # train/schedule.py
        timed_decay=cfg.optim.schedule == "wsd" and cfg.optim.decay > 0 and budget.deadline is not None,
    )  # fmt: skip


def _micro_step(run: _Run, batch: dict[str, Any], joint: bool) -> bool:
    """One micro-batch's forward, backward and (when it closes an accumulation) optimizer step;
    True when an optimizer step was taken."""
    accelerator, cfg = run.accelerator, run.cfg
    with accelerator.accumulate(run.model):
        result = run.model(batch, joint=joint)
        accelerator.backward(result["loss"])
        if accelerator.sync_gradients and cfg.optim.max_grad_norm > 0:
            accelerator.clip_grad_norm_(run.model.parameters(), cfg.optim.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    run.window.append(result["loss"].detach())
    run.parts_window.append(result["parts"].detach())
    run.tokens += batch["lengths"].sum()  # real (unpadded) tokens, stays on device
    run.pace.add(batch["lengths"], accelerator.sync_gradients)
    if not accelerator.sync_gradients:
        return False
    run.scheduler.step()
    run.step += 1
    if accelerator.device.type == "cpu" and cfg.heap_trim_every and run.step % cfg.heap_trim_every == 0:
        trim_heap()  # else RSS climbs for hours: see train/heap.py
    run.bar.update(1)
    return True


def _after_step(run: _Run, joint: bool) -> dict[str, Any] | None:
    """What follows an optimizer step: the log, a timed decay's start, the held-out evaluation,
    the checkpoint; the summary when the time budget ran out (None otherwise). Raises
    Interrupted, after saving, when a signal asked the run to stop."""
    accelerator, cfg, step = run.accelerator, run.cfg, run.step
    if step % cfg.log_every == 0 or step == run.end:
        lr = run.scheduler.get_last_lr()[0]
        logged = metrics.log_train(
            accelerator, step, run.window, run.parts_window, metrics.part_names(cfg), lr
        )
        logged.update(run.pace.read(accelerator))
        run.history.append(logged)
        run.bar.set_postfix(loss=f"{logged['loss']:.4f}")
        check_finite(logged["loss"], step, run.ckpt_root)
        run.window, run.parts_window = [], []
    run.budget.stepped()
    if run.timed_decay and not run.scheduler.timed and step < run.end:
        run.end = start_timed_decay(accelerator, run.scheduler, run.budget, cfg.optim.decay, step) or run.end
        run.bar.total = run.end
    if run.eval_loader is not None and (step % cfg.eval_every == 0 or step == run.end):
        since = clock()
        run.history.append(metrics.evaluate(accelerator, run.model, run.eval_loader, cfg, step, joint))
        run.model.train()
        run.budget.timed("eval", since)
        run.pace.restart()
    due = run.eval_loader is not None and ((step + 1) % cfg.eval_every == 0 or step + 1 == run.end)
    out_of_time, asked = agreed_stops(accelerator, run.budget, due, run.stop, step < run.end)
    # the last step saves too: `--resume max_steps=MORE` goes on from the finished head
    if (cfg.save_every and step % cfg.save_every == 0) or out_of_time or asked or step == run.end:
        _save(run)
    if out_of_time:
        run.bar.close()
        return stopped_summary(
            accelerator, cfg, step, run.history, run.tokens, run.state, run.budget, run.saved_at
        )
    if asked:
        run.bar.close()
        from headstart.errors import Interrupted

        raise Interrupted(
            f"training stopped at step {step} ({run.stop.signal}); checkpoint {run.saved_at}",
            "rerun the same command with --resume to continue",
        )
    return None


def _save(run: _Run) -> None:
    """A checkpoint of the step just taken (weights checked finite first)."""
    accelerator, since = run.accelerator, clock()
    check_weights_finite(accelerator, run.model, run.step, run.ckpt_root)
    extra = {
        "tokens": accelerator.reduce(run.tokens.clone(), "sum").item() / accelerator.num_processes,
        "history": run.history,
        "config": to_dict(run.cfg),  # what --resume must repeat (checkpoints.check_same_run)
    }
    run.saved_at = checkpoints.save_checkpoint(accelerator, run.ckpt_root, run.step, extra, run.cfg.keep_last)
    run.budget.timed("save", since)
    run.pace.restart()


def _stopped_at_once(run: _Run) -> Exception:
    """The error for a run stopped inside a step: nothing is saved (the state inside a step is not
    one a resume can go on from), so it names the newest checkpoint."""
    from headstart.errors import Interrupted

    saved = checkpoints.checkpoints(run.ckpt_root)
    where = (
        f"; the newest checkpoint is {saved[-1]} (the steps after it are lost)"
        if saved
        else "; no checkpoint was written (the steps done are lost)"
    )
    return Interrupted(
        f"training stopped at once (after {run.step} finished steps){where}",
        "rerun the same command with --resume to continue; one Ctrl-C (or SIGTERM) stops after "
        "the current step and saves it",
    )


def _finish(run: _Run, start: float, command: str | None) -> dict[str, Any]:
    """The final evaluation (unless the last step had one), the summary, the final head."""
    accelerator, state, history = run.accelerator, run.state, run.history
    if run.eval_loader is not None and not any(
        h.get("step") == run.step and h.get("kind") == "eval" for h in history
    ):
        history.append(
            metrics.evaluate(accelerator, run.model, run.eval_loader, run.cfg, run.step, False)
        )  # max_steps=0
    wall = clock() - start
    total_tokens = accelerator.reduce(run.tokens.clone(), "sum").item()  # cost: one sync at the end
    run_tokens = total_tokens - float(state.get("tokens", 0.0)) * accelerator.num_processes  # this session's
    summary = {
        "steps": run.step,
        "wall_s": round(wall, 2),
        "tokens": int(total_tokens),
        "tokens_per_s": round(run_tokens / wall, 1) if wall > 0 else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "processes": accelerator.num_processes,
        "resumed_from": int(state.get("step", 0)),
        "final_eval": next((h for h in reversed(history) if h.get("kind") == "eval"), {}),
        "history": history,
        "head": run.p.head_summary,
        "data": run.p.data.description,
        "command": command,
    }
    if accelerator.is_main_process:
        summary["final"] = str(
            save_final(accelerator.unwrap_model(run.model), run.cfg, run.p, summary, run.out)
        )
        metrics.write_json(run.out / "results.json", portable(summary) | {"provenance": stamp()})
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


def start_timed_decay(accelerator: Any, scheduler: Any, budget: Budget, share: float, step: int) -> int:
    """Start the wsd decay once the time budget says so (the same step and length on every
    process: the main one's call, broadcast); the run's new last step, or 0 while not yet.
    cost: with several processes, one tiny broadcast (a host sync) per step until it starts."""
    steps = budget.decay_steps(share)
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast

        steps = int(broadcast(torch.tensor([steps], device=accelerator.device), from_process=0).item())
    if not steps:
        return 0
    scheduler.start_decay(step, steps)
    logging.getLogger("headstart.train").info(
        "step %d: the learning rate decays to 0 over the %d steps the time budget has left (wsd)",
        step, scheduler.end_step - step,
    )  # fmt: skip
    return scheduler.end_step


def agreed_stops(
    accelerator: Any, budget: Budget, evaluates_next: bool, stop: StopRequest, more_steps: bool
) -> tuple[bool, bool]:
    """(out of time, asked to stop by a signal), the same on every process, so that all of them
    save the same step. cost: with several processes, one tiny gather (a host sync) per step."""
    if not more_steps:  # the last step ends the run anyway
        return False, False
    if accelerator.num_processes == 1:
        return budget.exhausted(evaluates_next), stop.requested
    local = torch.tensor([[budget.exhausted(evaluates_next), stop.requested]], device=accelerator.device)
    flags = accelerator.gather(local).any(dim=0).tolist()
    return bool(flags[0]), bool(flags[1])


def check_weights_finite(accelerator: Any, model: Any, step: int, ckpt_root: Path) -> None:
    """Refuse to save a checkpoint whose trainable weights hold nan or inf (a non-finite loss
    between two logs poisons them): `--resume` would go on from it, and the error for the loss
    would name it as the last good one. cost: one pass over the trainable weights and a host
    sync per checkpoint; a gather with several processes (sharded weights differ per process)."""
    trainable = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    finite = (
        torch.stack([torch.isfinite(q).all() for _, q in trainable])
        if trainable
        else torch.ones(1, dtype=torch.bool)
    )
    flag = (~finite.all()).reshape(1).to(accelerator.device)  # one sync below, not one per tensor
    if accelerator.num_processes > 1:
        flag = accelerator.gather(flag)
    if not bool(flag.any()):
        return
    bad = next((n for (n, _), ok in zip(trainable, finite.tolist(), strict=True) if not ok), None)
    from headstart.errors import HeadstartError

    saved = checkpoints.checkpoints(ckpt_root)
    raise HeadstartError(
        f"the head's weights are not finite at step {step} ({bad or 'on another process'}); no checkpoint "
        "was written" + (f" (last good checkpoint {saved[-1]})" if saved else ""),
        "check the data's cached features for inf (distill with --feature-dtype bfloat16) or lower optim.lr",
    )


def stopped_summary(accelerator: Any, cfg: TrainConfig, step: int, history: list[dict[str, Any]],
                    tokens: torch.Tensor, state: dict[str, Any], budget: Budget, saved: Path) -> dict[str, Any]:  # fmt: skip
    """A run that reached its time budget: its checkpoint, and how to go on."""

    total = accelerator.reduce(tokens.clone(), "sum").item()
    wall = clock() - budget.started
    run_tokens = total - float(state.get("tokens", 0.0)) * accelerator.num_processes
    summary = {
        "steps": step,
        "wall_s": round(wall, 2),
        "tokens": int(total),
        "tokens_per_s": round(run_tokens / wall, 1) if wall > 0 else None,
        "processes": accelerator.num_processes,
        "resumed_from": int(state.get("step", 0)),
        "stopped": f"time budget of {cfg.time_budget_s:g} s reached at step {step} of {cfg.max_steps}",
        "checkpoint": str(saved),
        "history": history,
    }
    if accelerator.is_main_process:
        logging.getLogger("headstart.train").info(
            "%s; checkpoint %s -- rerun the same command with --resume to continue", summary["stopped"], saved
        )
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


def save_final(model: Objective, cfg: TrainConfig, p: Any, summary: dict[str, Any], out: Path) -> Path:
    """The trained head in HF layout (out/final), with what the model card needs."""
    from headstart.heads.config import HeadConfig
    from headstart.heads.formats import detect_format
    from headstart.outputs import publish_dir

    head = model.head
    head.config.training = {
        "data": p.data.description,
        "datasets": p.data.sources,
        "command": summary.get("command"),
        "steps": summary["steps"],
        "global_batch": cfg.batch_size * cfg.grad_accum * summary["processes"],
        "loss": cfg.head.kind if not cfg.lora.enabled else kinds.get(cfg.head.kind).joint_lora,
        "metrics": {k: v for k, v in summary["final_eval"].items() if isinstance(v, float)},
    }
    if cfg.init_from and detect_format(cfg.init_from) != "headstart":
        head.config.training["init_from"] = (
            f"{cfg.init_from} ({detect_format(cfg.init_from)} format, imported)"
        )
    elif cfg.init_from:  # the model card says what the run continued from
        earlier = HeadConfig.read(cfg.init_from)
        relayout = (
            ", fc layout: warm start by headstart.heads.relayout"
            if earlier.layout != head.config.layout
            else ""
        )
        head.config.training["init_from"] = (
            f"{cfg.init_from} ({earlier.training.get('steps', '?')} steps on "
            f"{earlier.training.get('data', 'unrecorded data')}{relayout})"
        )
    final = head.save_pretrained(out / "final")
    if cfg.lora.enabled:  # Medusa-2: the adapted target goes with its heads
        publish_dir(out / "final-lora", lambda tmp: model.target.save_pretrained(str(tmp)))
    return final
