"""Typed configs: YAML + dotted overrides; unknown keys are errors naming the flag."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from headstart.config import load_config, parse_overrides, to_dict
from headstart.errors import HeadstartError


@dataclass
class Optim:
    lr: float = 1e-3
    """learning rate"""
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass
class Recipe:
    name: str = "x"
    steps: int = 10
    use_lora: bool = False
    kind: str | None = None
    layers: list[int] = field(default_factory=lambda: [1, 2])
    optim: Optim = field(default_factory=Optim)
    precision: Literal["no", "bf16"] = "bf16"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: base\nsteps: 5\noptim:\n  lr: 0.1\n")
    cfg = load_config(Recipe, path, ["steps=7", "optim.lr=3e-4", "layers=[4,5,6]", "use_lora=true"])
    assert cfg.name == "base" and cfg.steps == 7 and cfg.use_lora is True
    assert cfg.optim.lr == pytest.approx(3e-4) and cfg.layers == [4, 5, 6]
    assert to_dict(cfg)["optim"]["betas"] == [0.9, 0.95]


def test_unknown_key_names_flag_and_suggests():
    with pytest.raises(HeadstartError, match=r"unknown config key 'optim\.lrr'.*did you mean 'lr'"):
        load_config(Recipe, None, ["optim.lrr=1"])
    with pytest.raises(HeadstartError, match=r"unknown config key 'stpes'.*did you mean 'steps'"):
        load_config(Recipe, None, ["stpes=1"])


def test_type_errors_name_the_flag(tmp_path):
    with pytest.raises(HeadstartError, match="'steps' expects int"):
        load_config(Recipe, None, ["steps=fast"])
    with pytest.raises(HeadstartError, match="'use_lora' must be true or false"):
        load_config(Recipe, None, ["use_lora=maybe"])
    for word in ("true", "yes", "on"):  # YAML booleans; bool is an int subclass, not a count
        with pytest.raises(HeadstartError, match="'steps' expects int"):
            load_config(Recipe, None, [f"steps={word}"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(HeadstartError, match="not valid YAML"):
        load_config(Recipe, bad)
    with pytest.raises(HeadstartError, match="recipe file not found"):
        load_config(Recipe, tmp_path / "missing.yaml")


def test_parse_overrides_rejects_garbage():
    assert parse_overrides(["a.b=1", "a.c=x"]) == {"a": {"b": 1, "c": "x"}}
    with pytest.raises(HeadstartError, match="dotted.key=value"):
        parse_overrides(["novalue"])


def test_a_bare_no_picks_the_literal_choice_not_a_boolean(tmp_path):
    """YAML 1.1 reads `no` as False: `mixed_precision=no` must still mean the choice "no"."""
    assert load_config(Recipe, None, ["precision=no"]).precision == "no"
    path = tmp_path / "r.yaml"
    path.write_text("precision: no\n")
    assert load_config(Recipe, path).precision == "no"
    with pytest.raises(HeadstartError, match="must be one of"):
        load_config(Recipe, None, ["precision=yes"])


def test_a_loss_option_of_another_kind_is_refused(tiny_llama):
    """loss.* keys belong to the kinds whose objective reads them (their registration's
    loss_section): one set for another kind would be silently ignored, so it is refused in one
    line naming the kinds that take it."""
    from headstart.config import load_config
    from headstart.train.config import TrainConfig

    ok = load_config(TrainConfig, None, [f"target={tiny_llama}", "head.kind=eagle3", "loss.ttt_steps=2"])
    assert ok.loss.ttt_steps == 2
    with pytest.raises(HeadstartError) as err:
        load_config(TrainConfig, None, [f"target={tiny_llama}", "head.kind=medusa", "loss.ttt_steps=2"])
    assert err.value.what == "loss.ttt_steps is an option of eagle3 heads, not of medusa heads"
    with pytest.raises(HeadstartError, match="loss.eval_ttt_steps is an option of eagle3 and dflash heads"):
        load_config(TrainConfig, None, [f"target={tiny_llama}", "head.kind=eagle", "loss.eval_ttt_steps=3"])
