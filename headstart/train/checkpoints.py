"""Resumable training checkpoints: accelerate's full state (model, optimizer, scheduler, RNG of
every process) plus our step counter, written to a temp directory and renamed into place.

Naming and rotation stay here rather than in accelerate's ProjectConfiguration(total_limit,
automatic_checkpoint_naming): that writes straight into the checkpoint's final directory, so a
crash mid-save leaves a newest checkpoint that looks complete and rotation may already have
deleted the older good one; here a checkpoint exists only once complete and fsynced, and resume
falls back to the previous one when the newest does not load."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from headstart.config import build, to_dict
from headstart.errors import HeadstartError
from headstart.io import fsync_tree, normal_permissions
from headstart.train.config import TrainConfig

log = logging.getLogger(__name__)


STEP_DIR = re.compile(r"^step-(\d{8})$")
STATE = "trainer_state.json"


def checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under root, oldest first (a temp dir is never complete)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / STATE).is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))  # type: ignore[union-attr]


def save_checkpoint(
    accelerator: Any, root: str | Path, step: int, extra: dict[str, Any], keep_last: int
) -> Path:
    """Every process writes its part into root/.tmp-step-N; the main process publishes it."""
    root = Path(root)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))  # collective: model/optimizer/scheduler + per-process RNG
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE).write_text(json.dumps({"step": step, **extra}, indent=2))
        for path in [tmp, *tmp.rglob("*")]:  # safetensors writes 0600 files; the run's others are 0644
            normal_permissions(path)
        fsync_tree(tmp)  # durable before it is published: a power cut leaves the previous one
        if (final / STATE).is_file():  # a complete checkpoint of this run at the same step
            shutil.rmtree(final)
        elif final.exists():  # not one headstart completed: never deleted, moved aside
            aside = Path(tempfile.mkdtemp(prefix=f"{final.name}.kept-", dir=root))
            aside.rmdir()  # a fresh unique name: the folder itself takes it
            os.replace(final, aside)
            log.warning(
                f"warning: {final} held no {STATE} (not a checkpoint headstart finished); moved to {aside}"
            )
        os.replace(tmp, final)
        _fsync_dir(root)  # the rename itself
        for old in checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(accelerator: Any, root: str | Path) -> dict[str, Any]:
    """Restore the newest checkpoint that loads; returns its trainer state ({} when there is
    none). A damaged newest one (truncated weights, broken JSON) is reported and the previous
    one is used; only when none loads is it an error."""
    from safetensors import SafetensorError

    found = checkpoints(root)
    if not found:
        return {}
    failures = []
    for candidate in reversed(found):
        try:
            state = json.loads((candidate / STATE).read_text())
            accelerator.load_state(str(candidate))
        except (RuntimeError, ValueError, KeyError, OSError, EOFError, SafetensorError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            failures.append(f"{candidate.name}: {reason}")
            log.warning(f"warning: cannot resume from {candidate} ({reason}); trying an older checkpoint")
            continue
        return state
    raise HeadstartError(
        f"no checkpoint in {root} loads ({'; '.join(failures)})",
        "resume with the same recipe and number of processes, or start a new output_dir",
    )


# Settings a resumed run may change: how long it runs and what it reports, not what it computes
# (a path to the same target may be spelt otherwise on another machine: its fingerprint is checked
# where the target loads).
RESUMABLE = ("max_steps", "time_budget_s", "eval_every", "eval_batches", "log_every", "save_every", "keep_last",
             "trackers", "tracker_project", "output_dir", "heap_trim_every", "compile", "cpu", "topk", "target",
             "init_from", "data.eval_path")  # fmt: skip
"""Settings `--resume` may change; each kind's loss section adds its fields marked EVALUATION_ONLY."""


def resumable() -> tuple[str, ...]:
    """RESUMABLE and every kind's `loss.*` keys that only change its evaluation."""
    import dataclasses

    from headstart import kinds

    sections = [kind.section("loss") for kind in kinds.KINDS.values()]
    own = {
        f"loss.{f.name}"
        for section in sections
        if section is not None
        for f in dataclasses.fields(section)
        if f.metadata.get("resumable")
    }
    return RESUMABLE + tuple(sorted(own))


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _filled(saved: dict[str, Any]) -> dict[str, Any]:
    """The saved settings with every setting added since at its default: a run saved before a
    setting existed trained with what its default does (new settings default to the old
    behaviour), so resuming it is not a change. A saved key since removed or renamed cannot be
    filled: the settings are then compared as saved."""
    try:
        return to_dict(build(TrainConfig, saved))
    except HeadstartError:
        return saved


def check_same_run(config: dict[str, Any], root: str | Path) -> None:
    """`--resume` goes on with the settings its checkpoint was trained with: a changed head is
    refused before the target and data load (its weights would not fit), and so is any other
    change to what the run computes (optimizer, batch, data, loss, seed: the resumed run would be
    neither the old one nor a new one); only RESUMABLE settings may differ. A checkpoint from
    before the config was saved with it is let through with a warning."""
    found = checkpoints(root)
    if not found:
        return
    try:
        saved = json.loads((found[-1] / STATE).read_text()).get("config")
    except (OSError, ValueError):
        return  # load_checkpoint says what is wrong with it
    if not isinstance(saved, dict):
        log.warning(
            f"warning: {found[-1]} does not record its settings; make sure --resume repeats the recipe"
        )
        return
    before, now, free = flat(_filled(saved)), flat(config), resumable()
    changed = sorted(
        key for key in before.keys() | now.keys()
        if before.get(key) != now.get(key) and not any(key == r or key.startswith(r + ".") for r in free)
    )  # fmt: skip
    if not changed:
        return
    shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:6])
    more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
    head = any(key.startswith("head.") for key in changed)
    raise HeadstartError(
        f"--resume: the recipe differs from the run in {Path(root).parent} ({shown}{more})"
        + (": the checkpoint's head has another shape" if head else ""),
        "resume with the run's own settings (only max_steps, time_budget_s, evaluation and logging may change), "
        f"or start a new output_dir (init_from={Path(root).parent / 'final'} keeps a finished run's weights)",
    )
