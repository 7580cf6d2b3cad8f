"""The training objective projects only the positions it scores (the lm_heads never see prompt
tokens); its loss must equal the dense every-position loss that evaluation computes."""

from __future__ import annotations

import pytest
import torch
from tiny_data import self_distilled

from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.targets.features import Features
from headstart.train.config import TrainConfig
from headstart.train.data import collate
from headstart.train.objective import Objective
from headstart.train.setup import make_head, plan


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


def _objective(target, *overrides):
    cfg = load_config(TrainConfig, None, [f"target={target.spec}", "data.holdout=2", *overrides])
    data = self_distilled(target, count=8, vary=True)
    p = plan(cfg, data=data, target=target)
    torch.manual_seed(0)
    head = make_head(p)
    for param in head.parameters():  # leave the zero/target init: the losses must differ from trivial
        param.data.add_(0.02 * torch.randn_like(param))
    items = [
        {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask)}
        for ids, mask in zip(data.input_ids[:4], data.loss_mask[:4], strict=True)
    ]
    return Objective(head, target.model, cfg), collate(items)


@pytest.mark.parametrize(
    "overrides",
    [
        ["head.kind=medusa", "head.num_heads=3"],
        ["head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=3"],
    ],
    ids=["medusa", "eagle3"],
)
def test_scored_positions_loss_equals_the_dense_loss(target, overrides):
    objective, batch = _objective(target, *overrides)
    objective.eval()
    with torch.no_grad():
        sparse = objective(batch)
        dense = objective(batch, evaluate=True)
    assert sparse["loss"].item() > 0.1
    torch.testing.assert_close(sparse["loss"], dense["loss"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sparse["parts"], dense["parts"], rtol=1e-5, atol=1e-6)


def test_eagle3_sparse_unroll_gives_the_dense_gradients(target):
    """Training runs unroll steps 1.. at reply positions only and projects the labels once; the
    head's gradients must be those of the dense every-position loss."""
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=4")
    objective.eval()
    grads = []
    for evaluate in (False, True):
        objective.zero_grad()
        objective(batch, evaluate=evaluate)["loss"].backward()
        grads.append({n: p.grad.clone() for n, p in objective.head.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_offline_features_give_the_online_loss(target):
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=2")
    objective.eval()
    with torch.no_grad():
        online = objective(batch)
        feats: Features = objective.features(batch, grad=False, full_logits=True)
        cached = {"last": feats.last_hidden, **{f"layer{i}": x for i, x in feats.layers.items()}}
        offline = objective({**batch, "features": cached})
    torch.testing.assert_close(online["loss"], offline["loss"], rtol=1e-5, atol=1e-6)


def test_a_wrong_target_row_changes_the_loss(target):
    """Power check: the sparse path really reads the target's draft-vocabulary rows."""
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=2")
    objective.eval()
    with torch.no_grad():
        before = objective(batch)["loss"]
        objective._rows["weight"] = objective._rows["weight"].flip(0)
        after = objective(batch)["loss"]
    assert abs(before.item() - after.item()) > 1e-3


def test_the_target_rows_follow_a_changed_draft_vocabulary(target):
    """The rows are cached on a host-side key (no device sync per step): a new draft vocabulary
    (set_draft_vocab, a loaded checkpoint) re-gathers them."""
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=2")
    objective.eval()
    lm_head = target.model.get_output_embeddings().weight
    with torch.no_grad():
        objective(batch)
        first = objective._rows["weight"]
        objective(batch)
        assert objective._rows["weight"] is first  # reused while the vocabulary stays
        ids = torch.arange(64) + 7
        objective.head.set_draft_vocab(ids)
        objective(batch)
    torch.testing.assert_close(objective._rows["weight"], lm_head[ids])


def test_eagle3_eval_depth_is_set_apart_from_the_training_depth(target):
    """A head trained with one TTT step is still scored at 4 held-out steps (ablations compare
    depths on the same steps); the first steps' hits do not depend on how deep evaluation goes."""
    objective, batch = _objective(
        target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=1", "loss.eval_ttt_steps=4"
    )
    objective.eval()
    with torch.no_grad():
        train = objective(batch)
        deep = objective(batch, evaluate=True)
        objective.cfg.loss.eval_ttt_steps = 0
        shallow = objective(batch, evaluate=True)
    assert train["parts"].shape == (1,) and deep["hits"].shape[1] == 4 and shallow["hits"].shape[1] == 1
    torch.testing.assert_close(deep["hits"][:, :1], shallow["hits"])


def test_the_eagle3_loss_is_the_weighted_sum_of_its_kl_and_tv_terms(target):
    """loss.kl_weight and loss.tv_weight reach the loss: the mix is the sum of its parts (the
    maths of each term: tests/train/test_train_fused.py)."""
    objective, batch = _objective(target, "head.kind=eagle3", "head.draft_vocab_size=64", "loss.ttt_steps=3")
    objective.eval()
    losses = {}
    for kl, tv in ((1.0, 0.0), (0.0, 1.0), (1.0, 2.0)):
        objective.cfg.loss.kl_weight, objective.cfg.loss.tv_weight = kl, tv
        with torch.no_grad():
            losses[kl, tv] = objective(batch)
    torch.testing.assert_close(
        losses[1.0, 2.0]["loss"], losses[1.0, 0.0]["loss"] + 2 * losses[0.0, 1.0]["loss"]
    )
    tv = losses[0.0, 1.0]["parts"]
    assert ((tv > 0) & (tv <= 1)).all()  # a total-variation distance per step
    with pytest.raises(HeadstartError, match="both 0"):
        load_config(TrainConfig, None, ["head.kind=eagle3", "loss.kl_weight=0"])
