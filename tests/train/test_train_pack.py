"""Packed training rows (data.pack): whole conversations in rows of a fixed number of positions,
each conversation kept to itself. A packed row must train exactly as its conversations one a row
would: the same loss and gradients, online (the target runs over the row with a block-causal
mask) and offline (cached features joined); without the row's conversation marks it must not."""

from __future__ import annotations

import pytest
import torch
from test_train_objective import _objective
from tiny_data import self_distilled

from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.targets.features import capture
from headstart.train.config import TrainConfig
from headstart.train.data import Conversations, Packed, collate, pack_rows
from headstart.train.loop import train
from headstart.train.objectives.eagle.plan import ttt_plan

EAGLE3 = ("head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=3")


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


def test_pack_rows_fills_rows_best_fit_and_keeps_every_conversation_once():
    lengths = [7, 3, 5, 2, 8, 1, 4]
    rows = pack_rows(lengths, 10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    assert all(row == sorted(row) for row in rows)
    # longest first, each into the fullest row it fits: 8+2, 7+3, 5+4+1
    assert sorted(map(tuple, rows)) == [(0, 1), (2, 5, 6), (3, 4)]
    with pytest.raises(HeadstartError, match="does not fit a packed row of 10"):
        pack_rows([11], 10)


def test_a_packed_row_marks_each_conversation_and_clears_the_margin(target):
    data = self_distilled(target, count=4, vary=True)
    conversations = Conversations(data, [0, 1, 2, 3], max_length=64)
    packed = Packed(conversations, capacity=2 * 32, margin=9)  # the tiny rows: 8 + 24 - i % 7 tokens
    row = packed[0]
    parts = [conversations[i] for i in packed.rows[0]]
    assert len(packed.rows[0]) == 2 and packed.lengths[0] == len(row["input_ids"])
    assert row["docs"].tolist() == sum(([k] * len(p["input_ids"]) for k, p in enumerate(parts)), [])
    assert row["positions"].tolist() == sum((list(range(len(p["input_ids"]))) for p in parts), [])
    # the prompt is 8 tokens: a margin of 9 clears each conversation's first reply mark
    first = len(parts[0]["input_ids"])
    assert row["loss_mask"][8].item() == 0 and row["loss_mask"][first + 8].item() == 0
    assert row["loss_mask"].sum() == sum(int(p["loss_mask"].sum()) - 1 for p in parts)
    batch = collate([packed[0], packed[1]], 0)
    short = len(packed[1]["input_ids"])
    assert (batch["docs"][1, short:] == -1).all() and batch["positions"].shape == batch["input_ids"].shape


def _packed_batch(unpacked, offline_from=None):
    """The unpacked batch's conversations as ONE packed row (offline: with their features)."""
    items = []
    for ids, mask, n in zip(unpacked["input_ids"], unpacked["loss_mask"], unpacked["lengths"], strict=True):
        item = {"input_ids": ids[: int(n)], "loss_mask": mask[: int(n)]}
        if offline_from is not None:
            item["features"] = offline_from(item["input_ids"])
        items.append(item)
    row = {
        "input_ids": torch.cat([it["input_ids"] for it in items]),
        "loss_mask": torch.cat([it["loss_mask"] for it in items]),
        "docs": torch.cat([torch.full((len(it["input_ids"]),), k) for k, it in enumerate(items)]),
        "positions": torch.cat([torch.arange(len(it["input_ids"])) for it in items]),
    }
    if offline_from is not None:
        row["features"] = {k: torch.cat([it["features"][k] for it in items]) for k in items[0]["features"]}
        for item in items:
            item.pop("features")
    return row, items


def _loss_and_grads(objective, batch):
    objective.zero_grad()
    out = objective(batch)
    out["loss"].backward()
    return (
        out["loss"].detach(),
        out["parts"].detach(),
        {n: p.grad.clone() for n, p in objective.head.named_parameters() if p.grad is not None},
    )


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("planned", [False, True], ids=["own-plan", "collated-plan"])
def test_a_packed_row_trains_as_its_conversations_one_a_row(target, mode, planned):
    objective, unpacked = _objective(target, *EAGLE3)
    objective.eval()  # no dropout: the two batches must see the same function
    layers = objective.head.feature_layers

    def offline(ids):
        feats = capture(target.model, ids[None], layers=layers, logits_to_keep=1)
        return {"last": feats.last_hidden[0], **{f"layer{i}": feats.layers[i][0] for i in layers}}

    row, items = _packed_batch(unpacked, offline if mode == "offline" else None)
    planner = (lambda mask: ttt_plan(mask, 3)) if planned else None
    if mode == "offline":
        for item in items:
            item["features"] = offline(item["input_ids"])
    one_a_row = collate(items, 0, planner)
    packed = collate([row], 0, planner)
    assert packed["input_ids"].shape[0] == 1 and one_a_row["input_ids"].shape[0] == 4
    want, got = _loss_and_grads(objective, one_a_row), _loss_and_grads(objective, packed)
    assert want[0].item() > 0.1
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    assert got[2].keys() == want[2].keys() and want[2]
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # the marks are what keeps them apart: without them the row is one long conversation
    blurred = {k: v for k, v in packed.items() if k not in ("docs", "positions")}
    assert (_loss_and_grads(objective, blurred)[0] - want[0]).abs().item() > 1e-3


def _cfg(target, out, *extra):
    return load_config(TrainConfig, None, [
        f"target={target.spec}", f"output_dir={out}", "max_steps=4", "eval_every=4", "log_every=2",
        "save_every=4", "keep_last=1", "batch_size=2", "optim.lr=5e-3", "data.holdout=4",
        "trackers=[none]", "data.max_length=64", *extra,
    ])  # fmt: skip


def test_training_on_packed_rows_runs_and_refuses_a_kind_that_cannot_pack(target, tmp_path):
    data = self_distilled(target, count=20, vary=True)
    summary = train(_cfg(target, tmp_path / "a", *EAGLE3, "data.pack=96"), data=data, target=target)
    logged = [h for h in summary["history"] if h.get("kind") != "eval"]
    assert summary["steps"] == 4 and logged and all(h["loss"] > 0 for h in logged)
    # 4 steps of 2 rows of ~3 conversations: more tokens than 4 steps of 2 conversations hold
    assert summary["tokens"] > 4 * 2 * 32
    with pytest.raises(HeadstartError, match="head.kind=medusa trains one conversation a row"):
        train(_cfg(target, tmp_path / "b", "head.kind=medusa", "data.pack=96"), data=data, target=target)
    with pytest.raises(HeadstartError, match="data.pack=32 is shorter than data.max_length=64"):
        _cfg(target, tmp_path / "c", *EAGLE3, "data.pack=32")
