"""A new head kind costs files, not switches: no module outside the registry and a kind's own
modules (its head, drafter, objective and sections, as its registration names them, and the
adapters of the formats it lists, with the helpers they import) holds a kind's name as a string
literal. The few that must (a foreign format's marker,
a user-facing preset) are listed here, each with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from headstart import kinds

PACKAGE = Path(__file__).resolve().parents[2] / "headstart"
ALLOWED = {
    ("targets/load.py", "medusa"): "the `model_type` of a Medusa-format checkpoint (a format, not the kind)",
    (
        "distill/config.py",
        "eagle3",
    ): "--feature-layers' preset: the EAGLE-3 release's taps (also DFlash's default)",
    ("distill/features.py", "eagle3"): "the same preset, parsed",
    ("catalogue.py", "*"): "the registrations",
    ("kinds.py", "medusa"): "the kind a recipe's head: section gets when it names none",
    ("heads/formats/__init__.py", "medusa"): "--format medusa (vLLM's Medusa layout), a format's name",
    ("heads/formats/__init__.py", "dflash"): "--format dflash (z-lab's layout), a format's name",
    ("heads/formats/__init__.py", "eagle"): "--format eagle (the EAGLE-3 release's layout), a format's name",
    ("heads/formats/eagle.py", "eagle"): "the same format's name, in its refusals",
}


def owners() -> dict[str, set[str]]:
    """Module path (relative to the package) -> the kinds whose registration names it."""
    owned: dict[str, set[str]] = {}
    from headstart.heads.formats import ADAPTERS

    every = [(kind.name, [*kind.heads.values(), kind.drafter, kind.objective, kind.head_section or "",
                          kind.loss_section or "", kind.config_section or "",
                          *(helpers(ADAPTERS[fmt]) for fmt in kind.formats if fmt != "headstart")])
             for kind in kinds.KINDS.values()]  # fmt: skip
    every = [
        (name, [r for ref in refs for r in ([ref] if isinstance(ref, str) else ref)]) for name, refs in every
    ]
    every += [(kind.name, [kind.load, kind.candidates, kind.default, kind.check or ""])
              for kind in kinds.DRAFT_KINDS.values()]  # fmt: skip
    for name, refs in every:
        for ref in refs:
            module = ref.partition(":")[0]
            if module.startswith("headstart."):
                path = module.removeprefix("headstart.").replace(".", "/")
                files = [path + ".py"]
                if (PACKAGE / path).is_dir():  # a kind's folder (train/objectives/eagle/): every file in it
                    files = [f.relative_to(PACKAGE).as_posix() for f in (PACKAGE / path).glob("*.py")]
                for file in files:
                    owned.setdefault(file, set()).add(name)
    return owned


def helpers(adapter: str) -> list[str]:
    """A format's adapter module and the modules of heads/formats/ it imports (its layout helpers)."""
    path = PACKAGE / (adapter.removeprefix("headstart.").replace(".", "/") + ".py")
    found = [adapter]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "headstart.heads.formats":
            found += [f"headstart.heads.formats.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headstart.heads.formats."):
            found.append(node.module or "")
    return [
        m for m in found if (PACKAGE / (m.removeprefix("headstart.").replace(".", "/") + ".py")).is_file()
    ]


def test_kind_names_live_only_with_their_kinds():
    """Head kinds and the drafters with nothing to train (their bench baseline names too)."""
    drafters = {n for kind in kinds.DRAFT_KINDS.values() for n in (kind.name, kind.baseline)}
    names, owned, found = set(kinds.names()) | drafters, owners(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                mine = owned.get(where, set())
                if node.value in mine or (where, node.value) in ALLOWED or (where, "*") in ALLOWED:
                    continue
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not found, (
        "kind names outside their kinds (move the switch onto the HeadKind or the head class):\n"
        + "\n".join(found)
    )


def test_every_allowed_entry_is_still_needed():
    """The list only shrinks: an entry no file needs any more is removed."""
    for (where, name), _reason in ALLOWED.items():
        if name == "*":
            continue
        tree = ast.parse((PACKAGE / where).read_text())
        assert any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree)), (where, name)
