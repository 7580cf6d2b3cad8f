"""Static tree buffers, batched tree helpers and `--tree` parsing."""

from __future__ import annotations

import json

import pytest
import torch

from headstart.errors import HeadstartError
from headstart.inference.trees import DynamicTree
from headstart.inference.trees.draft import children_from_parents, path_to
from headstart.inference.trees.spec import parse_tree
from headstart.inference.trees.static import DEFAULT_PATHS, build_tree, chain, default_tree


def test_build_tree_buffers():
    tree = build_tree([[1], [0], [0, 0], [0, 1], [1, 0]])  # given out of order on purpose
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tree.parents.tolist() == [0, 0, 0, 1, 1, 2]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.ranks.tolist() == [0, 0, 1, 0, 1, 0]
    assert tree.children.tolist() == [[1, 2], [3, 4], [5, -1], [-1, -1], [-1, -1], [-1, -1]]
    assert tree.visible[4].tolist() == [True, True, False, False, True, False]
    assert tree.visible.sum().item() == 1 + 2 * 2 + 3 * 3  # root 1, depth-1 nodes 2, depth-2 nodes 3
    assert tree.retrieve.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert tree.expanding(1).tolist() == [1, 2] and tree.expanding(2).tolist() == []
    assert tree.size == 6 and tree.max_depth == 2


def test_tree_is_frozen():
    with pytest.raises(AttributeError):
        default_tree().parents = torch.zeros(1)  # type: ignore[misc]


@pytest.mark.parametrize(
    "paths, message",
    [
        ([[0, 0]], "missing"),
        ([[0], [2]], "skip a rank"),
        ([[0], [0]], "twice"),
        ([[]], "non-empty"),
        ([[-1]], "ranks >= 0"),
    ],
)
def test_bad_trees_are_clear_errors(paths, message):
    with pytest.raises(HeadstartError, match=message):
        build_tree(paths)


def test_default_tree_and_chain():
    assert default_tree().size == len(DEFAULT_PATHS) + 1
    assert default_tree(max_depth=2).max_depth == 2
    assert build_tree(chain(4)).parents.tolist() == [0, 0, 1, 2, 3]


def test_parse_tree_specs(tmp_path):
    assert parse_tree(None).paths == DEFAULT_PATHS
    assert parse_tree("static", max_depth=3).max_depth == 3
    assert parse_tree("chain:2").size == 3
    assert parse_tree("[[0],[1],[0,0]]").size == 4
    assert parse_tree("dynamic") == DynamicTree()
    assert parse_tree("dynamic:depth=3,top_k=2,total_tokens=5") == DynamicTree(3, 2, 5)
    file = tmp_path / "t.json"
    file.write_text(json.dumps({"paths": [[0], [0, 0]]}))
    assert parse_tree(str(file)).size == 3
    # "²" and "³" are str.isdigit() but not int(); a nesting past Python's recursion limit
    deep = "[" * 50_000
    for bad in [
        "nonsense",
        "dynamic:depth=x",
        "chain:0",
        "[[0],",
        "dynamic:width=3",
        "chain:²",
        "dynamic:top_k=³",
        deep,
    ]:
        with pytest.raises(HeadstartError):
            parse_tree(bad)
    with pytest.raises(HeadstartError, match="levels deep"):
        parse_tree("chain:5", max_depth=3)


def test_children_from_parents_orders_siblings_best_first():
    parents = torch.tensor([[0, 0, 0, 1, 1, 2]])
    order = torch.tensor([[0.0, -2.0, -1.0, -5.0, -3.0, -4.0]])
    assert children_from_parents(parents, order).tolist() == [
        [[2, 1], [4, 3], [5, -1], [-1, -1], [-1, -1], [-1, -1]]
    ]


def test_path_to_pads_short_rows_with_their_last_node():
    tree = build_tree([[0], [1], [0, 0]])
    visible = tree.visible.expand(2, -1, -1)
    path, lengths = path_to(visible, torch.tensor([3, 2]))
    assert path.tolist() == [[0, 1, 3], [0, 2, 2]] and lengths.tolist() == [3, 2]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("chain:1000", "at most 256 nodes and depth 32"),
        ("chain:100000000", "at most 256 nodes"),  # refused before building 10^8 paths
        ("dynamic:depth=100,top_k=10,total_tokens=5000", "depth must be in 1..32"),
        ("dynamic:depth=6,top_k=10,total_tokens=5000", "total_tokens must be in 1..256"),
        ("dynamic:depth=6,top_k=1000,total_tokens=60", "top_k must be in 1..64"),
        (json.dumps([[0] * (d + 1) for d in range(40)]), "depth 40"),
    ],
)
def test_huge_trees_are_refused(spec, message):
    with pytest.raises(HeadstartError, match=message):
        parse_tree(spec)


def test_huge_lookup_branches_are_refused():
    from headstart.inference.trees.lookup import split_lookup

    assert split_lookup("chain:1+lookup:64")[1].tokens == 64
    with pytest.raises(HeadstartError, match="1 to 64 looked-up tokens"):
        split_lookup("chain:1+lookup:100000")
