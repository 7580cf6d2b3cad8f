"""`--tree` values: a static tree (default, chain, JSON paths or a JSON file) or a dynamic one.

static                                   the default static tree (cut to a Medusa head's depth)
chain:4                                  a single top-1 path of 4 drafts
[[0],[1],[0,0]]                          index paths, inline JSON
tree.json                                a file with a JSON list of paths, or {"paths": [...]}
dynamic                                  EAGLE-2 dynamic tree with default sizes
dynamic:depth=4,top_k=4,total_tokens=12  EAGLE-2 with explicit sizes
<any of these>+lookup:4                  plus a prompt-lookup branch of 4 tokens (inference/trees/lookup.py;
                                         split off by the decoder before `parse_tree`)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.inference.trees.dynamic import DynamicTree
from headstart.inference.trees.lookahead import LookaheadTree
from headstart.inference.trees.lookup import SUFFIX, Lookup, WithLookup, split_lookup
from headstart.inference.trees.protocol import Tree
from headstart.inference.trees.static import (
    ROOT_ONLY,
    TreeBuffers,
    build_tree,
    chain,
    check_tree_size,
    default_tree,
)

TreeSpec = Tree
"""Any tree keeping the protocol (the name the decoder's signatures use)."""


def _paths_from_json(data: Any, source: str) -> TreeBuffers:
    if isinstance(data, dict) and "paths" in data:
        data = data["paths"]
    if not isinstance(data, list) or not all(
        isinstance(p, list) and all(isinstance(i, int) for i in p) for p in data
    ):
        raise HeadstartError(
            f"{source} is not a list of index paths", 'write e.g. [[0], [1], [0, 0]] or {"paths": [...]}'
        )
    if not any(data):
        raise HeadstartError(
            f"{source} has no draft node", "give at least one path, e.g. [[0]] (or --no-heads)"
        )
    return build_tree(data)


def _dynamic(spec: str) -> DynamicTree:
    from headstart.inference.trees.options import int_options

    return DynamicTree(**int_options(spec, spec.partition(":")[2], ("depth", "top_k", "total_tokens"),
                                     "use dynamic:depth=4,top_k=4,total_tokens=12"))  # fmt: skip


def parse_tree(spec: str | TreeSpec | None, max_depth: int | None = None) -> TreeSpec:
    """Resolve a `--tree` value; static trees deeper than `max_depth` (Medusa heads) are errors,
    except the default tree, which is cut to fit."""
    if spec is None or spec == "static":
        return default_tree(max_depth)
    if isinstance(spec, str) and not spec.strip():
        raise HeadstartError(
            "--tree is empty", "leave it out for the tuned or default tree, or e.g. --tree chain:3"
        )
    if isinstance(spec, TreeBuffers | DynamicTree | LookaheadTree):  # parsed already
        tree = spec
    elif spec == "dynamic" or spec.startswith("dynamic:"):
        tree = _dynamic(spec) if spec != "dynamic" else DynamicTree()
    elif spec.startswith("chain:"):
        depth = spec.partition(":")[2]
        if not (depth.isascii() and depth.isdigit()) or int(depth) < 1:  # "²" is a digit, not an int
            raise HeadstartError(f"bad chain tree '{spec}'", "use chain:N with N >= 1, e.g. chain:4")
        check_tree_size(int(depth), int(depth))  # before a list of N paths is built
        tree = build_tree(chain(int(depth)))
    elif spec.lstrip().startswith("["):
        try:
            tree = _paths_from_json(json.loads(spec), "--tree")
        except (json.JSONDecodeError, RecursionError) as err:  # RecursionError: nested past any tree
            raise HeadstartError(
                f"--tree is not valid JSON: {err}", "e.g. --tree '[[0],[1],[0,0]]'"
            ) from None
    elif Path(spec).is_file():
        try:
            tree = _paths_from_json(json.loads(Path(spec).read_text(encoding="utf-8")), spec)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise HeadstartError(f"tree file {spec} is not valid UTF-8 JSON: {err}", "fix the file") from None
    elif spec.endswith(".json"):
        raise HeadstartError(f"tree file not found: {spec}", "check the path, or pass the paths inline")
    else:
        raise HeadstartError(
            f"unknown tree '{spec}'",
            "use static, dynamic[:depth=..,top_k=..,total_tokens=..], chain:N, JSON paths or a .json file",
        )
    if isinstance(tree, TreeBuffers) and max_depth is not None and tree.max_depth > max_depth:
        raise HeadstartError(
            f"the tree is {tree.max_depth} levels deep but the heads draft only {max_depth}",
            f"use a tree of depth <= {max_depth}",
        )
    return tree


@dataclass(frozen=True)
class TreeChoice:
    """A `--tree` value parsed once, at the edge (`choose_tree`): what every command, the tuner and
    the decoder pass along instead of the string. `tree` is None for the default static tree, cut
    to the heads' depth when they are known (`resolve`)."""

    text: str
    """As the user (or the tuned tree) wrote it: what reports show."""
    tree: TreeSpec | None
    lookup: Lookup | None = None
    """A prompt-lookup branch verified beside the drafted tree (`+lookup:K`)."""

    def resolve(self, max_depth: int | None, drafted: bool = True) -> TreeSpec:
        """The tree for heads that draft at most `max_depth` levels (None: any depth), with its
        lookup branch (lookup.WithLookup); `drafted` False: the root alone (plain decoding),
        plus any lookup branch."""
        tree = parse_tree(self.tree, max_depth) if drafted else ROOT_ONLY
        return WithLookup(tree, self.lookup) if self.lookup is not None else tree

    def without_lookup(self) -> TreeChoice:
        """The same tree without its lookup branch."""
        if self.lookup is None:
            return self
        return TreeChoice(self.text.partition(SUFFIX)[0] or "static", self.tree, None)

    def for_sampling(self) -> TreeChoice:
        """The tree a sampling lane decodes with: a lookup branch stays only where the tree's
        drafts are one-point proposals (a dynamic tree); a static tree's children are drawn from
        q, and exact acceptance cannot mix those with looked-up tokens (the one place this rule
        is applied: the speculator's lanes, a tuned tree, a calibrated one)."""
        tree = self.tree
        return self if tree is not None and tree.samples_with_lookup else self.without_lookup()


def choose_tree(spec: str | TreeChoice | TreeSpec | None) -> TreeChoice:
    """Parse a `--tree` value (or take a parsed one): every syntax error is one line, here."""
    if isinstance(spec, TreeChoice):
        return spec
    if isinstance(spec, WithLookup):  # a resolved tree with its lookup branch
        inner = choose_tree(spec.base)
        return TreeChoice(f"{inner.text}{SUFFIX}{spec.lookup.tokens}", inner.tree, spec.lookup)
    if isinstance(spec, LookaheadTree):
        return TreeChoice(spec.text, spec)
    if spec is None or isinstance(spec, TreeBuffers | DynamicTree):
        return TreeChoice("static" if spec is None else type(spec).__name__, spec)
    if not spec.strip():
        raise HeadstartError(
            "--tree is empty", "leave it out for the tuned or default tree, or e.g. --tree chain:3"
        )
    base, lookup = split_lookup(spec)
    return TreeChoice(spec, None if base in (None, "static") else parse_tree(base), lookup)
