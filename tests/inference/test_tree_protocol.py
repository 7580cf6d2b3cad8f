"""Every tree class keeps the one protocol (headstart.inference.trees.protocol.Tree), and each
`--tree` syntax parses to a value that keeps it: the decoder, engine and tuner rely on nothing else."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from headstart.inference import trees
from headstart.inference.trees import Tree, choose_tree
from headstart.inference.trees.lookahead import parse_lookahead

TREES = Path(trees.__file__).parent


@pytest.mark.parametrize(
    "spec",
    ["chain:3", "[[0],[0,0],[1]]", "dynamic", "dynamic:depth=3,top_k=2,total_tokens=6", "chain:2+lookup:4"],
)
def test_every_tree_syntax_parses_to_the_protocol(spec):
    choice = choose_tree(spec)
    tree = choice.resolve(4)
    assert isinstance(tree, Tree), type(tree)
    assert tree.verify_nodes(4) >= 1 and tree.verify_bound() >= tree.verify_nodes(4)
    assert tree.draft_nodes(4, 0) <= tree.draft_nodes(4, 4)


def test_lookahead_and_the_default_tree_keep_it():
    assert isinstance(parse_lookahead("lookahead:window=4,ngram=3,guesses=2"), Tree)
    assert isinstance(choose_tree(None).resolve(3), Tree)


def test_every_class_with_a_draft_method_in_trees_keeps_it():
    """A new tree class in inference/trees/ that drafts is checked against the protocol's methods."""
    wanted = {name for name, _ in inspect.getmembers(Tree, inspect.isfunction) if not name.startswith("_")}
    for path in TREES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name != "Tree":
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                if "draft" in methods:
                    assert wanted <= methods, (path.name, node.name, wanted - methods)


def test_a_lookup_branch_is_a_tree_over_its_base():
    """`+lookup:K` resolves to one Tree (lookup.WithLookup): its counts include the branch, it
    reads the rows' contexts, and it refuses sampling beside a static tree (the one rule), not
    beside a dynamic one; without heads it is the root alone plus the branch."""
    from headstart.errors import HeadstartError

    static, dynamic = choose_tree("chain:2+lookup:4"), choose_tree("dynamic+lookup:3")
    tree, base = static.resolve(4), choose_tree("chain:2").resolve(4)
    assert tree.verify_nodes(4) == base.verify_nodes(4) + 4 and tree.verify_bound() == base.verify_bound() + 4
    assert tree.reads_context and not base.reads_context and tree.levels(4) == base.levels(4)
    with pytest.raises(HeadstartError, match="a lookup branch with sampling needs a dynamic tree"):
        tree.check_sampling()
    dynamic.resolve(4).check_sampling()
    again = choose_tree(tree)  # a resolved tree passed back in keeps its branch
    assert again.lookup == static.lookup and again.resolve(4).verify_nodes(4) == tree.verify_nodes(4)
    plain = static.resolve(4, drafted=False)
    assert plain.verify_nodes(4) == 1 + 4 and plain.levels(4) == 0
