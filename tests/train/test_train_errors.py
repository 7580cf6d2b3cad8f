"""Bad input fails with one clear HeadstartError before any compute."""

from __future__ import annotations

import pytest
from tiny import make_target_dir

from headstart.cli import main
from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.train.config import TrainConfig
from headstart.train.data import TrainData
from headstart.train.setup import plan


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.target import load_target

    return load_target(str(tiny_llama))


def _data(fingerprint, count=8):
    return TrainData([[5, 6, 7, 8, 9, 10]] * count, [[0, 0, 1, 1, 1, 1]] * count, fingerprint, "test data")


def _cfg(target, *extra):
    return load_config(TrainConfig, None, [f"target={target.spec}", "batch_size=2", *extra])


def test_data_from_another_target_names_both(target, tiny_root):
    from headstart.target import load_target

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
    with pytest.raises(HeadstartError, match="needs head.kind=medusa"):
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
    newest = tmp_path / "checkpoints" / "step-00000004"
    for weights in newest.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])
    summary = train(_short(target, tmp_path), data=_data(target.fingerprint), target=target, resume=True)
    assert summary["resumed_from"] == 2
    assert "cannot resume from" in capsys.readouterr().err


def test_ctrl_c_saves_and_says_to_resume(target, tmp_path, monkeypatch):
    from headstart.train.loop import train
    from headstart.train.objective import Objective

    real, calls = Objective.forward, {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Objective, "forward", interrupted)
    with pytest.raises(HeadstartError, match="interrupted at step 3; checkpoint") as err:
        train(_short(target, tmp_path, "save_every=0"), data=_data(target.fingerprint), target=target)
    assert "--resume" in err.value.fix
    assert (tmp_path / "checkpoints" / "step-00000003").is_dir()


def test_a_non_finite_loss_stops_training_in_one_line(tmp_path):
    """NaN from inf features (float16 overflow) stops at the first log, naming the likely cause."""
    from headstart.errors import HeadstartError
    from headstart.train.loop import check_finite

    check_finite(2.5, 10, tmp_path)
    with pytest.raises(HeadstartError, match="loss is nan at step 25.*feature-dtype bfloat16"):
        check_finite(float("nan"), 25, tmp_path)
