"""The EAGLE-3 step's host-side plan: made by the collate, it gives the loss and gradients of
the plan the step makes itself; widths in buckets change nothing but the filler; with it the
whole training loss traces as one graph (no host sync, no data-dependent shape)."""

from __future__ import annotations

import pytest
import torch
from test_train_objective import _objective

from headstart.train.data import collate
from headstart.train.objectives.eagle import ttt_train_loss
from headstart.train.objectives.eagle.plan import round_up, ttt_plan


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


def _loss_and_grads(objective, batch):
    objective.zero_grad()
    out = objective(batch)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in objective.head.named_parameters() if p.grad is not None}
    return out["loss"].detach(), out["parts"], grads


def _items(batch):
    return [
        {"input_ids": ids[: int(n)], "loss_mask": mask[: int(n)]}
        for ids, mask, n in zip(batch["input_ids"], batch["loss_mask"], batch["lengths"], strict=True)
    ]


@pytest.mark.parametrize("bucket", [1, 16])
def test_the_collated_plan_gives_the_loss_and_gradients_of_the_steps_own(target, bucket):
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=4")
    objective.eval()
    planned = collate(_items(batch), 0, lambda mask: ttt_plan(mask, 4, bucket=bucket))
    assert "plan" not in batch and planned["plan"].first >= (bucket if bucket > 1 else 1)
    own, given = _loss_and_grads(objective, batch), _loss_and_grads(objective, planned)
    torch.testing.assert_close(own[0], given[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(own[1], given[1], rtol=1e-6, atol=1e-7)
    assert own[2].keys() == given[2].keys() and own[2]
    for name, grad in own[2].items():
        torch.testing.assert_close(grad, given[2][name], rtol=1e-5, atol=1e-6, msg=name)  # fp32 ulps of ~1


def test_the_plan_selects_each_steps_scored_positions_and_their_labels():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]])
    plan = ttt_plan(mask, 2)
    # step 0 at t scores x_{t+2}: row 0 t=0..2, row 1 t=0..0 (t=-1 is no position); step 1 x_{t+3}
    assert plan.per_step == (3 + 1, 2)  # row 1 has no x_{t+3} in its reply
    assert plan.first == 3 and plan.later == 2
    # the needed labels: t with x_{t+1} a reply token, row-major over (2, 6)
    assert plan.needed.tolist() == [1, 2, 3, 6, 7]
    # step 1 at t learns the distribution at t+2: row 0 t=0 -> label at 2 (row 1 of needed)
    step1 = plan.step_of == 1
    assert plan.rows[step1].tolist() == [1, 2]
    assert round_up(17, 16, 40) == 32 and round_up(17, 16, 20) == 20 and round_up(5, 1, 9) == 5


def test_the_plan_moves_with_the_batch_and_keeps_its_host_figures():
    plan = ttt_plan(torch.tensor([[0, 1, 1, 1]]), 3, bucket=16)
    moved = plan.to("meta")
    assert moved.select.device.type == "meta" and moved.per_step == plan.per_step
    assert moved.first == plan.first == 2  # a bucket never passes T - 2 (positions that score nothing)


def test_with_a_plan_the_training_loss_is_one_graph(target):
    """fullgraph=True fails at any graph break: a host sync (.item, .tolist, a bool of a tensor)
    or a data-dependent shape (boolean indexing, nonzero) in the step."""
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=3")
    planned = collate(_items(batch), 0, lambda mask: ttt_plan(mask, 3))
    feats = objective.features(planned, grad=False, full_logits=False)
    h0 = objective.head.fuse(feats.last_hidden, feats.layers)

    def step(h0, ids, mask):
        return ttt_train_loss(
            objective, h0, feats, {"input_ids": ids, "loss_mask": mask, "plan": planned["plan"]}, None
        )

    traced = torch.compile(step, fullgraph=True, backend="eager")
    got = traced(h0, planned["input_ids"], planned["loss_mask"])
    torch.testing.assert_close(got[0], step(h0, planned["input_ids"], planned["loss_mask"])[0])
