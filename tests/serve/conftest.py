"""The serve tests' fixtures: random EAGLE-3 heads for the tiny target, and a server with them."""

from __future__ import annotations

import pytest
import torch
from serving import Server


@pytest.fixture(scope="session")
def heads(tmp_path_factory, tiny_llama):
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    folder = tmp_path_factory.mktemp("serve-heads") / "eagle3"
    counts = torch.arange(288.0)
    build_head(HeadSpec(kind="eagle3", draft_vocab_size=100), target, token_counts=counts).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def server(tiny_llama, heads, tmp_path_factory):
    srv = Server(tiny_llama, heads, tmp_path_factory.mktemp("serve"), "--max-batch", "4")
    yield srv
    assert srv.stop() == 0, srv.output()
