"""The optimizer's schedule comes from transformers, trackers follow the user's own setup."""

from __future__ import annotations

import pytest
import torch

from headstart.config import load_config
from headstart.train.config import TrainConfig
from headstart.train.setup import make_optimizer, trackers, wandb_configured


@pytest.mark.parametrize(("schedule", "at_end"), [("constant", 1.0), ("cosine", 0.0), ("linear", 0.0)])
def test_schedules_warm_up_then_follow_their_shape(schedule, at_end):
    cfg = load_config(TrainConfig, None, ["max_steps=20", "optim.lr=0.01", "optim.warmup_steps=4",
                                          f"optim.schedule={schedule}", "trackers=[none]"])  # fmt: skip
    optimizer, scheduler = make_optimizer(cfg, [torch.nn.Parameter(torch.zeros(2))])
    rates = []
    for _ in range(20):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 0.0 and rates[2] == pytest.approx(0.005) and rates[4] == pytest.approx(0.01)
    assert scheduler.get_last_lr()[0] == pytest.approx(0.01 * at_end, abs=1e-9)
    if schedule == "cosine":
        assert rates[12] == pytest.approx(0.005)  # half-way through the decay


def test_wandb_stays_offline_unless_the_user_set_it_up(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb"))
    assert not wandb_configured()
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password KEY\n")
    assert wandb_configured()  # `wandb login` writes this: the user's mode is kept
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_configured()
    cfg = load_config(TrainConfig, None, ["trackers=[wandb]", "tracker_project=my-heads"])
    assert cfg.tracker_project == "my-heads"
    try:
        chosen = trackers(cfg)
    except Exception as err:  # wandb not installed here: the one-line error names the fix
        assert "pip install wandb" in str(err)
    else:
        assert chosen == ["wandb"]
    import os

    assert os.environ["WANDB_MODE"] == "online"


def test_missing_extras_name_the_extra_to_install(monkeypatch, tmp_path, caplog):
    """peft (Medusa-2) and matplotlib (bench plots) are extras: without them, one line naming it."""
    import importlib.util

    from headstart.errors import HeadstartError
    from headstart.train.setup import add_lora

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("peft", "matplotlib") else real(name, *a))  # fmt: skip
    cfg = load_config(TrainConfig, None, ["lora.enabled=true"])
    with pytest.raises(HeadstartError, match=r"needs peft.*headstart\[lora\]"):
        add_lora(cfg, torch.nn.Linear(2, 2))
    import headstart.bench.report as report

    monkeypatch.setattr(report, "markdown", lambda _report: "")  # the table is not what is tested
    with caplog.at_level("WARNING", logger="headstart"):
        report.write_report({"methods": {}, "by_category": {}}, tmp_path / "report")
    assert (tmp_path / "report" / "report.json").is_file() and not list((tmp_path / "report").glob("*.png"))
    assert "headstart[plots]" in caplog.text


def test_token_counts_count_reply_tokens_of_the_chosen_conversations():
    """The draft vocabulary's counts: reply tokens only (loss mask 1), of the given conversations."""
    from headstart.train.data import TrainData, token_counts

    data = TrainData(
        input_ids=[[1, 2, 3, 3], [3, 4, 4], [5, 5, 5]],
        loss_mask=[[0, 1, 1, 1], [0, 0, 1], [1, 1, 1]],
        fingerprint=None,
        description="tiny",
    )
    counts = token_counts(data, [0, 1], vocab=8)
    assert counts.dtype == torch.float64 and counts.tolist() == [0, 0, 1, 2, 1, 0, 0, 0]
    assert token_counts(data, [], vocab=8).tolist() == [0.0] * 8


def test_a_second_run_in_one_process_takes_its_own_mixed_precision(tmp_path):
    """accelerate keeps one process-wide state: a bf16 run followed by an fp32 one (a notebook,
    the profile script, the next test) must not be refused as 'already initialized'."""
    from headstart.train.setup import make_accelerator

    for precision in ("bf16", "no", "bf16"):
        cfg = load_config(TrainConfig, None, [f"mixed_precision={precision}", "cpu=true", "trackers=[none]",
                                              f"output_dir={tmp_path / precision}"])  # fmt: skip
        assert make_accelerator(cfg).mixed_precision == precision
