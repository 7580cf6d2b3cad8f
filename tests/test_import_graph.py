"""The package's import graph, read with ast (no third-party tool): no import circle between modules
(imports inside functions count: a lazy import is still a dependency; so does a registry's
"headstart.module:attribute" string, imported when first asked for), no import from a lower
package up into the command line (`headstart.commands`, `headstart.cli`), and the package's parts
in layers (LAYERS): each imports only parts of lower layers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "headstart"
TOP = ("headstart.cli", "headstart.commands", "headstart.__main__")
"""The command line: only these may import headstart.commands or headstart.cli."""
REFERENCE = re.compile(r"(headstart(?:\.\w+)+):\w+")
"""A registry's lazy import: "headstart.inference.drafters.eagle:EagleDrafter" (headstart/catalogue.py);
a string naming a module of the package, "headstart.heads.formats.zlab", counts as well."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `path` imports anywhere in its body (functions included; imports only
    for type checking excepted: they never run). `from pkg import name` is an edge to the submodule
    `pkg.name` when there is one, else to `pkg` itself."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            reference = REFERENCE.fullmatch(node.value)
            if reference:
                found.add(reference.group(1))
            elif node.value.count(".") >= 2 and node.value in known:  # a module path in a registry
                found.add(node.value)  # (formats' ADAPTERS, the CLI's commands); "headstart.x" are loggers
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name in known and name != here}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_nothing_below_the_command_line_imports_it():
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in graph().items()
        if not name.startswith(TOP)
        for target in targets
        if target.startswith(TOP)
    )
    assert not upward, "\n".join(upward)


LAYERS = (
    ("errors",),
    ("io", "logs", "hardware", "interrupts", "kinds", "config", "provenance", "records"),
    ("outputs",),
    ("targets",),  # the frozen target: loading, features, attention, kernels
    ("target", "heads", "inference"),  # heads and the decode loop know nothing of each other
    ("drafts", "tuned", "distill", "calibration"),
    ("train", "speculator", "serve"),  # serve --record writes distill's layout
    ("decoding", "bench"),
    ("catalogue",),  # the registrations, naming every kind's modules
    ("headstart",),  # the package's __init__
    ("commands",),
    ("cli",),
    ("__main__",),
)
"""The package's top-level parts, lowest first (a part: headstart.X and everything under it)."""


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_each_part_imports_only_lower_layers():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    edges = graph()
    unplaced = sorted({part(m) for m in edges} - set(rank))
    assert not unplaced, f"place these parts of the package in LAYERS: {unplaced}"
    wrong = sorted(
        f"{source} imports {target} (layer {rank[part(target)]} >= {rank[part(source)]})"
        for source, targets in edges.items()
        for target in targets
        if part(source) != part(target) and rank[part(target)] >= rank[part(source)]
    )
    assert not wrong, "imports against the layers (move the code down, or the import):\n" + "\n".join(wrong)


def test_the_checker_sees_circles_and_lazy_imports(tmp_path, monkeypatch):
    """The checker itself: a circle made by a lazy import inside a function is found."""
    root = tmp_path / "headstart"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "a.py").write_text("from headstart.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from headstart.sub.a import x\n")
    (root / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from headstart.sub import a\n"
    )
    (root / "d.py").write_text(
        'REGISTRY = {"x": "headstart.e:Thing", "y": "headstart.sub.f"}\n'
    )  # registry strings
    (root / "e.py").write_text("import headstart.d\n")
    (root / "sub" / "f.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", root)
    edges = graph()
    assert edges["headstart.sub.a"] == {"headstart.sub.b"} and edges["headstart.sub.b"] == {"headstart.sub.a"}
    assert edges["headstart.c"] == set()  # type-checking imports never run
    assert edges["headstart.d"] == {"headstart.e", "headstart.sub.f"}
    assert cycles(edges) == [["headstart.d", "headstart.e"], ["headstart.sub.a", "headstart.sub.b"]]


def test_no_module_asks_which_kind_of_tree_it_holds():
    """Outside headstart/inference/trees/, trees are used through their protocol: no isinstance
    on a tree class (each such switch was a place a new tree kind had to be added)."""
    trees = {
        node.name
        for path in (PACKAGE / "inference" / "trees").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert {"TreeBuffers", "DynamicTree", "LookaheadTree"} <= trees  # every class defined there
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "inference/trees/" in path.as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                named = {
                    n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
                    for n in ast.walk(node.args[1])
                }
                if named & trees:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_no_submodule_is_named_like_a_name_its_package_exports():
    """`from headstart.targets import describe` gave the module headstart/targets/describe.py once
    another command had imported it (importing a submodule sets the package's attribute), and a
    distill refusal then raised TypeError: a package's exported names and its submodules differ."""
    clashes = []
    for init in PACKAGE.rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        exported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        submodules = {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
        submodules |= {p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()}
        for name in exported & submodules:
            node = next(
                n
                for n in tree.body
                if isinstance(n, ast.ImportFrom) and name in {a.asname or a.name for a in n.names}
            )
            if node.module not in (
                module_name(init),
                f"{module_name(init)}.{name}",
            ):  # the submodule itself: fine
                clashes.append(f"{module_name(init)}.{name}")
    assert not clashes, clashes
