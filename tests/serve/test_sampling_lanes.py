"""A tuned static tree with a lookup branch (the shipped Medusa heads' `chain:1+lookup:2`) serves
sampled requests: their lane drafts without the branch (exact sampling cannot mix a static tree's
drawn drafts with looked-up tokens), greedy ones with it."""

from __future__ import annotations

import json
import shutil

from serving import Server, http


def test_a_tuned_lookup_tree_serves_sampled_requests(tiny_llama, heads, tmp_path):
    tuned = tmp_path / "heads"
    shutil.copytree(heads, tuned)
    (tuned / "tuned_tree.json").write_text(
        json.dumps({"tree": "chain:1+lookup:2", "device": "cpu", "threads": 1})
    )
    server = Server(tiny_llama, tuned, tmp_path)
    try:
        for temperature in (0.0, 0.8):
            body = {"model": server.model, "prompt": "one two three one two", "max_tokens": 8,
                    "temperature": temperature, "seed": 1}  # fmt: skip
            status, reply = http("POST", f"{server.url}/v1/completions", json.dumps(body).encode())
            assert status == 200, reply
    finally:
        assert server.stop() == 0, server.output()
