"""The package stays readable: no function longer than LIMIT lines (a long one was where logic
piled up: the training loop, the app's routes, the distill pipeline; split it into named phases)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "headstart"
LIMIT = 80


def long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_function_is_longer_than_the_limit():
    found = long_functions(PACKAGE, LIMIT)
    assert not found, f"functions over {LIMIT} lines:\n" + "\n".join(found)


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}\n")
    assert long_functions(tmp_path, LIMIT) == [f"m.py:5 long: {LIMIT + 1} lines"]
