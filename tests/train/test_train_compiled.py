"""`compile: true`: the compiled target forward gives capture's features, the compiled step the
eager step's loss and gradients, and after two batches of different lengths no batch length
compiles again (AOT autograd without code generation here, as the decode graphs' tests do;
one slow test runs inductor)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_train_objective import _objective
from test_train_plan import _items, _loss_and_grads

from headstart.errors import HeadstartError
from headstart.targets.features import capture
from headstart.train.compiled import compiled_features
from headstart.train.data import collate
from headstart.train.objective import Objective
from headstart.train.objectives.eagle.plan import ttt_plan


@pytest.fixture(scope="module")
def target(tiny_root):
    """4 layers: the taps [0, 1, 2] leave out the last one (see the refusal below)."""
    from tiny import make_target_dir

    from headstart.targets import load_target

    return load_target(str(make_target_dir(tiny_root, "llama", seed=49, num_hidden_layers=4)))


HEAD = ("head.kind=eagle3", "head.draft_vocab_size=64", "head.feature_layers=[0,1,2]", "loss.ttt_steps=3")


def test_the_compiled_target_forward_gives_captures_features(target):
    ids = torch.randint(3, target.vocab_size, (3, 11))
    want = capture(target.model, ids, layers=[0], logits_to_keep=1)
    got = compiled_features(target.model, ids, [0], "aot_eager")
    assert got.logits is None and list(got.layers) == [0]
    torch.testing.assert_close(got.last_hidden, want.last_hidden)
    torch.testing.assert_close(got.layers[0], want.layers[0])
    # the hidden states' last entry is the final norm's output: the last layer is refused
    with pytest.raises(HeadstartError, match="last layer"):
        compiled_features(target.model, ids, [0, 3], "aot_eager")


def _compiled_objective(target, eager, backend):
    return Objective(
        eager.head, target.model, dataclasses.replace(eager.cfg, compile=True), compile_backend=backend
    )


def _planned(batch, steps, keep=None):
    items = _items(batch)
    if keep is not None:  # shorter conversations: another batch length
        items = [{k: v[:keep] for k, v in it.items()} for it in items]
    return collate(items, 0, lambda mask: ttt_plan(mask, steps, bucket=16))


def _check_equal(eager, compiled, batch, rtol=1e-5, atol=1e-6):
    want, got = _loss_and_grads(eager, batch), _loss_and_grads(compiled, batch)
    torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol)
    assert got[2].keys() == want[2].keys() and got[2]
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=100 * rtol, atol=atol, msg=name)


def test_the_compiled_step_gives_the_eager_loss_and_gradients_and_no_recompile_after_two_lengths(target):
    from torch._dynamo.utils import counters

    eager, batch = _objective(target, *HEAD)
    eager.eval()
    compiled = _compiled_objective(target, eager, "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    for keep in (None, 20):  # warm-up: two lengths
        _check_equal(eager, compiled, _planned(batch, 3, keep))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for keep in (26, 17, 23):
            planned = _planned(batch, 3, keep)
            assert planned["input_ids"].shape[1] == keep
            _check_equal(eager, compiled, planned)
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.slow
def test_inductor_compiles_the_step_to_the_eager_loss_and_gradients(target):
    eager, batch = _objective(target, *HEAD)
    eager.eval()
    _check_equal(eager, _compiled_objective(target, eager, "inductor"), _planned(batch, 3), 1e-4, 1e-5)
