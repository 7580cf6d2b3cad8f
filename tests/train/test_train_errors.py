"""Bad input fails with one clear HeadstartError before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny import make_target_dir

from headstart.cli import main
from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.train.config import TrainConfig
from headstart.train.data import TrainData
from headstart.train.setup import plan


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


def _data(fingerprint, count=8):
    return TrainData([[5, 6, 7, 8, 9, 10]] * count, [[0, 0, 1, 1, 1, 1]] * count, fingerprint, "test data")


def _cfg(target, *extra):
    return load_config(TrainConfig, None, [f"target={target.spec}", "batch_size=2", *extra])


def test_data_from_another_target_names_both(target, tiny_root):
    from headstart.targets import load_target

    other = load_target(str(make_target_dir(tiny_root, "qwen2")))
    with pytest.raises(HeadstartError) as err:
        plan(_cfg(target), data=_data(other.fingerprint), target=target)
    assert (
        "distilled from" in err.value.what
        and "Qwen2ForCausalLM" in err.value.what
        and "LlamaForCausalLM" in err.value.what
    )


def test_empty_data_and_no_reply_tokens(target):
    with pytest.raises(HeadstartError, match="is empty"):
        plan(_cfg(target), data=_data(target.fingerprint, count=0), target=target)
    silent = TrainData([[5, 6, 7]] * 4, [[0, 0, 0]] * 4, target.fingerprint)
    with pytest.raises(HeadstartError, match="no reply tokens"):
        plan(_cfg(target), data=silent, target=target)
    with pytest.raises(HeadstartError, match="outside the target vocabulary"):
        plan(_cfg(target), data=TrainData([[5, 999]] * 4, [[0, 1]] * 4, target.fingerprint), target=target)


def test_head_that_does_not_fit_the_target(target):
    with pytest.raises(HeadstartError, match="exceeds the target vocabulary"):
        plan(
            _cfg(target, "head.kind=eagle3", "head.draft_vocab_size=5000"),
            data=_data(target.fingerprint),
            target=target,
        )
    with pytest.raises(HeadstartError, match="out of range"):
        plan(
            _cfg(target, "head.kind=eagle3", "head.feature_layers=[0,1,30]"),
            data=_data(target.fingerprint),
            target=target,
        )


def test_offline_without_cached_features(target):
    with pytest.raises(HeadstartError, match="cached features"):
        plan(_cfg(target, "data.mode=offline"), data=_data(target.fingerprint), target=target)


def test_recipe_errors(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("head:\n  kind: medusa\n  num_head: 3\n")
    with pytest.raises(HeadstartError, match="did you mean 'num_heads'"):
        load_config(TrainConfig, recipe)
    with pytest.raises(HeadstartError, match="not an option of eagle3 heads .fix: set head.kind=medusa"):
        load_config(TrainConfig, None, ["head.kind=eagle3", "lora.enabled=true"])
    with pytest.raises(HeadstartError, match="cannot use cached features"):
        load_config(TrainConfig, None, ["lora.enabled=true", "data.mode=offline"])
    with pytest.raises(HeadstartError, match="unknown trackers"):
        load_config(TrainConfig, None, ["trackers=[mlflow]"])


def test_null_data_paths_mean_none():
    """`data.eval_path=null` (a recipe's eval set dropped on the command line) is no eval set,
    not a crash when the data is loaded; a null data.path still fails as empty."""
    cfg = load_config(TrainConfig, None, ["data.path=[a, b]", "data.eval_path=null"])
    assert cfg.data.path == ["a", "b"] and cfg.data.eval_path == [] and cfg.data.holdout == 0.05
    from headstart.train.data import load_distilled_data

    with pytest.raises(HeadstartError, match="data.path is empty"):
        load_distilled_data(load_config(TrainConfig, None, ["data.path=null"]).data)


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim:\n  learning_rate: 0.1\n")
    assert main(["train", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown config key 'optim.learning_rate'" in err[0] and "fix:" in err[0]
    assert main(["train", "--recipe", str(tmp_path / "missing.yaml")]) == 2


def test_missing_distilled_dir_and_wandb(target, tmp_path):
    with pytest.raises(HeadstartError, match="not a distilled data set"):
        plan(_cfg(target, f"data.path={tmp_path}"), target=target)
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        from headstart.train.setup import trackers

        with pytest.raises(HeadstartError, match="wandb is not installed"):
            trackers(_cfg(target, "trackers=[wandb]"))


def test_existing_checkpoints_need_resume(target, tmp_path):
    from headstart.train.loop import train

    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-00000004" / "trainer_state.json").write_text("{}")
    with pytest.raises(HeadstartError, match="pass --resume"):
        train(_cfg(target, f"output_dir={tmp_path}"), data=_data(target.fingerprint), target=target)


def test_output_dir_checked_and_locked_before_any_work(target, tmp_path):
    from headstart.io import lock_dir
    from headstart.train.loop import train

    (tmp_path / "file").write_text("")
    with pytest.raises(HeadstartError, match="is a file"):
        train(
            _cfg(target, f"output_dir={tmp_path / 'file' / 'run'}"),
            data=_data(target.fingerprint),
            target=target,
        )
    held = lock_dir(tmp_path / "run", "headstart train")
    try:
        with pytest.raises(HeadstartError, match="another `headstart train` is writing"):
            train(
                _cfg(target, f"output_dir={tmp_path / 'run'}"), data=_data(target.fingerprint), target=target
            )
    finally:
        held.close()


def _short(target, out, *extra):
    return _cfg(target, f"output_dir={out}", "max_steps=6", "save_every=2", "keep_last=2", "eval_every=100",
                "head.kind=medusa", "head.num_heads=1", "data.holdout=0", "trackers=[]", *extra)  # fmt: skip


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(target, tmp_path, capsys):
    from headstart.train.loop import train

    train(_short(target, tmp_path), data=_data(target.fingerprint), target=target)
    newest = tmp_path / "checkpoints" / "step-00000006"  # the last step's (keep_last=2: 4 and 6)
    for weights in newest.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])
    summary = train(_short(target, tmp_path), data=_data(target.fingerprint), target=target, resume=True)
    assert summary["resumed_from"] == 4
    assert "cannot resume from" in capsys.readouterr().err


def _varied(fingerprint, count=16):
    """Conversations that differ, so that a step applied twice or skipped shows in the weights."""
    ids = [[5 + i % 7, 6 + i % 3, 7, 8 + i % 5, 9, 10 + i % 4] for i in range(count)]
    return TrainData(ids, [[0, 0, 1, 1, 1, 1]] * count, fingerprint, "varied test data")


def _signal_at_forward(monkeypatch, call, signum=None, times=1):
    """Send this process a signal (SIGINT: Ctrl-C) `times` times inside the call-th Objective forward."""
    import os
    import signal

    from headstart.train.objective import Objective

    real, seen = Objective.forward, {"n": 0}

    def forward(self, *args, **kwargs):
        seen["n"] += 1
        for _ in range(times if seen["n"] == call else 0):
            os.kill(os.getpid(), signum or signal.SIGINT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Objective, "forward", forward)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_mid_step_stops_after_it_and_resume_is_exact(target, tmp_path, monkeypatch, signame):
    """Ctrl-C (or a scheduler's SIGTERM) in the first micro-batch of step 3 of 2-micro-batch steps:
    the step finishes, its checkpoint is saved, and the resumed run ends with the weights of the
    uninterrupted one (a checkpoint from inside the step put accelerate's micro-step counter, or
    the update, out of line with the step number)."""
    import signal

    from safetensors.torch import load_file

    from headstart.train.loop import train

    def cfg(out):
        return _short(target, out, "save_every=0", "grad_accum=2", "max_steps=5", "optim.lr=3e-3")

    train(cfg(tmp_path / "whole"), data=_varied(target.fingerprint), target=target)
    _signal_at_forward(monkeypatch, 5, signum=getattr(signal, signame))  # step 3's first micro-batch
    with pytest.raises(HeadstartError, match=f"stopped at step 3 \\({signame}\\); checkpoint") as err:
        train(cfg(tmp_path / "cut"), data=_varied(target.fingerprint), target=target)
    assert "--resume" in err.value.fix
    assert [c.name for c in (tmp_path / "cut" / "checkpoints").iterdir()] == ["step-00000003"]
    monkeypatch.undo()
    summary = train(cfg(tmp_path / "cut"), data=_varied(target.fingerprint), target=target, resume=True)
    assert summary["resumed_from"] == 3
    whole = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_a_second_ctrl_c_stops_at_once_and_saves_nothing_from_inside_the_step(target, tmp_path, monkeypatch):
    import headstart.interrupts
    from headstart.train.loop import train

    monkeypatch.setattr(headstart.interrupts, "FORWARDED_S", 0.0)  # the two come 2 s apart or more

    _signal_at_forward(monkeypatch, 3, times=2)  # twice in step 3 (one micro-batch a step); saves every 2
    with pytest.raises(HeadstartError, match="stopped at once .*newest checkpoint is .*step-00000002"):
        train(_short(target, tmp_path, "save_every=2"), data=_data(target.fingerprint), target=target)
    assert [c.name for c in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]


def test_non_finite_weights_are_never_checkpointed(target, tmp_path, monkeypatch):
    """A NaN loss between two logs poisons the weights: the next save refuses them, and the error
    names the last good checkpoint (which --resume would use), not a poisoned one."""
    from headstart.train.loop import train
    from headstart.train.objective import Objective

    real, seen = Objective.forward, {"n": 0}

    def poisoned(self, *args, **kwargs):
        seen["n"] += 1
        out = real(self, *args, **kwargs)
        if seen["n"] == 3:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(Objective, "forward", poisoned)
    with pytest.raises(
        HeadstartError, match="weights are not finite at step 4 .*last good checkpoint .*step-00000002"
    ):
        train(_short(target, tmp_path, "log_every=5"), data=_data(target.fingerprint), target=target)
    assert [c.name for c in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]


def test_resume_with_more_steps_goes_on_from_the_finished_head(target, tmp_path):
    """The last step keeps a checkpoint (also with save_every=0, "only at the end"): `--resume
    max_steps=MORE` continues the finished run, as check_run_dir's hint says, and (at a constant
    learning rate) ends where one run of MORE steps would."""
    from safetensors.torch import load_file

    from headstart.train.loop import train

    def cfg(out, steps):
        # constant: a cosine's first run would decay over its own 3 steps
        return _short(
            target, out, "save_every=0", f"max_steps={steps}", "optim.lr=3e-3", "optim.schedule=constant"
        )

    train(cfg(tmp_path / "whole", 6), data=_varied(target.fingerprint), target=target)
    train(cfg(tmp_path / "on", 3), data=_varied(target.fingerprint), target=target)
    summary = train(cfg(tmp_path / "on", 6), data=_varied(target.fingerprint), target=target, resume=True)
    assert summary["resumed_from"] == 3
    whole = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    on = load_file(str(tmp_path / "on" / "final" / "model.safetensors"))
    assert all(torch.equal(whole[k], on[k]) for k in whole)


def test_resume_never_replaces_a_finished_head_with_one_from_scratch(target, tmp_path):
    import shutil

    from headstart.train.loop import train

    train(_short(target, tmp_path, "max_steps=2"), data=_data(target.fingerprint), target=target)
    shutil.rmtree(tmp_path / "checkpoints")  # a run from before the last step kept one, or cleaned up
    with pytest.raises(
        HeadstartError, match="holds no checkpoint to continue from .only a finished run's"
    ) as err:
        train(
            _short(target, tmp_path, "max_steps=4"),
            data=_data(target.fingerprint),
            target=target,
            resume=True,
        )
    assert "init_from=" in err.value.fix


def test_a_non_finite_loss_stops_training_in_one_line(tmp_path):
    """NaN from inf features (float16 overflow) stops at the first log, naming the likely cause."""
    from headstart.errors import HeadstartError
    from headstart.train.loop import check_finite

    check_finite(2.5, 10, tmp_path)
    with pytest.raises(HeadstartError, match="loss is nan at step 25.*feature-dtype bfloat16"):
        check_finite(float("nan"), 25, tmp_path)


@pytest.mark.parametrize(
    ("setting", "message"),
    [("save_every=-5", "save_every must be >= 0"), ("eval_batches=-1", "eval_batches must be >= 0")],
)
def test_negative_counts_are_refused(target, setting, message):
    """save_every=-5 acted as 5, eval_batches=-1 silently skipped every evaluation."""
    with pytest.raises(HeadstartError, match=message):
        _cfg(target, setting)


def test_resume_without_a_checkpoint_says_so_and_starts_nothing(target, tmp_path):
    from headstart.train.loop import train

    with pytest.raises(HeadstartError, match="--resume: .* holds no checkpoint to continue from") as err:
        train(_short(target, tmp_path / "new"), data=_data(target.fingerprint), target=target, resume=True)
    assert err.value.fix == "drop --resume to start a new run there"
    assert not (tmp_path / "new").exists()


def test_a_step_directory_headstart_did_not_finish_is_moved_aside_never_deleted(target, tmp_path, caplog):
    """checkpoints/step-N without a trainer state is not a checkpoint headstart completed (a copy,
    a user's folder): a save at that step keeps it under another name."""
    from headstart.train.loop import train

    mine = tmp_path / "checkpoints" / "step-00000002"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    train(_short(target, tmp_path), data=_data(target.fingerprint), target=target)
    kept = list((tmp_path / "checkpoints").glob("step-00000002.kept-*"))
    assert len(kept) == 1 and (kept[0] / "notes.txt").read_text() == "mine"
    assert "held no trainer_state.json" in caplog.text


def test_dry_run_says_the_real_run_would_fail_without_its_data(tmp_path, capsys):
    from headstart.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"target: smollm2\noutput_dir: {tmp_path / 'out'}\ndata: {{path: [{tmp_path / 'nodata'}]}}\n"
    )
    assert main(["train", "--recipe", str(recipe), "--dry-run"]) == 2  # as the real run would fail
    captured = capsys.readouterr()
    assert (
        f"distilled data {tmp_path / 'nodata'} does not exist" in json.loads(captured.out)["missing_data"][0]
    )
    assert "error: the real run would refuse this recipe: distilled data" in captured.err


def test_resume_refuses_a_changed_head_or_math_before_loading_anything(target, tmp_path, monkeypatch):
    """`--resume` after the head or what the run computes changed fails in one line before the
    target and data load (it failed late, with a state_dict error, or went on silently); the
    run's length, evaluation and logging may change."""
    from headstart.train import loop
    from headstart.train.loop import train

    train(_short(target, tmp_path, "max_steps=2"), data=_data(target.fingerprint), target=target)
    loaded = []
    monkeypatch.setattr(loop, "_train", lambda *a, **k: loaded.append(1) or {"steps": 0})
    # (another kind: the recipe's num_heads=1 set back to its default, which says nothing to EAGLE)
    for change, named in ((["head.kind=eagle", "head.num_heads=3"], "head.kind"), (["head.num_heads=2"], "head.num_heads"),
                          (["optim.lr=0.5", "batch_size=3"], "batch_size"), (["seed=7"], "seed")):  # fmt: skip
        with pytest.raises(HeadstartError, match=f"--resume: the recipe differs .*{named}"):
            train(_short(target, tmp_path, "max_steps=4", *change), resume=True)
    assert not loaded
    train(_short(target, tmp_path, "max_steps=4", "log_every=1", "eval_every=1"), resume=True)
    assert loaded == [1]


def test_resume_takes_a_setting_added_since_the_run_was_saved_at_its_default(tmp_path):
    """A run saved before a setting existed (head.lora_rank came later) trained with that setting's
    default: resuming it is not a change (it was refused as 'head.lora_rank: None -> 0'); the
    setting at another value still is, and so is a saved key since removed."""
    from headstart.config import to_dict
    from headstart.heads import HeadSpec
    from headstart.train import checkpoints
    from headstart.train.config import TrainConfig

    now = to_dict(TrainConfig(target="smollm2", head=HeadSpec(kind="draft_model")))
    saved = json.loads(json.dumps(now))
    del saved["head"]["lora_rank"], saved["optim"]["schedule"]
    step = tmp_path / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    (step / checkpoints.STATE).write_text(json.dumps({"step": 2, "config": saved}))
    checkpoints.check_same_run(now, tmp_path / "checkpoints")
    changed = json.loads(json.dumps(now))
    changed["head"]["lora_rank"] = 4
    with pytest.raises(HeadstartError, match=r"head.lora_rank: 0 -> 4"):
        checkpoints.check_same_run(changed, tmp_path / "checkpoints")
    saved["head"]["retired_option"] = 1
    (step / checkpoints.STATE).write_text(json.dumps({"step": 2, "config": saved}))
    with pytest.raises(HeadstartError, match=r"head.lora_rank: None -> 0"):
        checkpoints.check_same_run(now, tmp_path / "checkpoints")


def test_dry_run_says_what_the_real_run_refuses_about_data_and_output(tmp_path, capsys, monkeypatch):
    from headstart.cli import main

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("x")
    data = tmp_path / "data"
    data.mkdir()
    for output, words in ((home, "is the home directory"), (tmp_path / "repo", "holds a git repository"),
                          (tmp_path / "foreign", "holds no headstart training run"), (tmp_path / "afile", "is a file")):  # fmt: skip
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"target: smollm2\noutput_dir: {output}\ndata: {{path: [{data}]}}\n")
        assert main(["train", "--recipe", str(recipe), "--dry-run"]) == 2
        captured = capsys.readouterr()
        assert words in json.loads(captured.out)["output_problems"][0], output
        assert "error: the real run would refuse this recipe" in captured.err and words in captured.err
    recipe.write_text(f"target: smollm2\noutput_dir: {tmp_path / 'new'}\ndata: {{path: []}}\n")
    assert main(["train", "--recipe", str(recipe), "--dry-run"]) == 2
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["missing_data"] == [
        "no training data: data.path is empty (fix: set data.path=DIR, a `headstart distill` output)"
    ]
    assert "no training data: data.path is empty" in captured.err
    assert plan["output_problems"] == [] and not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["head.num_layers=99"], "a draft model needs fewer layers than the target's 30"),
        (["head.draft_from={sibling}", "head.num_layers=2"], "head.num_layers and head.draft_from both set"),
        (
            ["head.kind=eagle3", "head.feature_layers=[2,40,50]"],
            "layer ids [40, 50] out of range for a target with 30 layers",
        ),
        (["head.draft_vocab_size=100000", "head.kind=eagle3"], "exceeds the target vocabulary (49152)"),
        (["init_from={nothing}"], "is not a saved head (no config.json)"),
    ],
)
def test_dry_run_refuses_what_the_real_run_refuses_about_the_head(tmp_path, capsys, overrides, words):
    """The head's shape against the target's config (read without its weights), with the recipe a
    user would start from: the real run refuses these after loading the target."""
    from headstart.cli import main

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-draft-cpu.yaml"
    data = tmp_path / "data"
    data.mkdir()
    filled = [o.format(sibling=tmp_path, nothing=tmp_path / "nothing") for o in overrides]
    args = ["train", "--recipe", str(recipe), "--dry-run", f"output_dir={tmp_path / 'out'}", f"data.path=[{data}]",
            "data.eval_path=[]", *filled]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: the real run would refuse this recipe" in err and words in err, err
    assert main(["train", "--recipe", str(recipe), "--dry-run", f"output_dir={tmp_path / 'out'}",
                 f"data.path=[{data}]", "data.eval_path=[]"]) == 0  # fmt: skip


def test_resume_may_change_what_a_kind_marks_evaluation_only(tmp_path):
    """A kind's loss section marks its evaluation-only keys (EVALUATION_ONLY: EAGLE-3's
    loss.eval_ttt_steps) and --resume lets them change, as it lets eval_every; its other keys
    (loss.ttt_steps) change what the run computes and are refused."""
    from headstart.config import to_dict
    from headstart.heads import HeadSpec
    from headstart.train import checkpoints
    from headstart.train.config import TrainConfig

    saved = to_dict(TrainConfig(target="smollm2", head=HeadSpec(kind="eagle3")))
    step = tmp_path / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    (step / checkpoints.STATE).write_text(json.dumps({"step": 2, "config": saved}))
    evaluation = json.loads(json.dumps(saved))
    evaluation["loss"]["eval_ttt_steps"] = 3
    checkpoints.check_same_run(evaluation, tmp_path / "checkpoints")
    math = json.loads(json.dumps(saved))
    math["loss"]["ttt_steps"] = 3
    with pytest.raises(HeadstartError, match=r"loss.ttt_steps: 7 -> 3"):
        checkpoints.check_same_run(math, tmp_path / "checkpoints")
