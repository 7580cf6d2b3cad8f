"""The front door holds: every relative link in the repository's markdown resolves, and every file
under docs/ is reachable from the README (a page through links, a data file by a link or as the
JSON/PNG beside a reachable page of the same name)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SKIP = (".venv", ".git", "runs", "build", "node_modules", ".pytest_cache")


def _pages() -> list[Path]:
    return [p for p in REPO.rglob("*.md") if not any(part in SKIP or part.endswith(".egg-info")
                                                     for part in p.relative_to(REPO).parts)]  # fmt: skip


def _links(page: Path) -> list[tuple[str, Path]]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold commands, not links
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # http(s), mailto, anchors
        path = unquote(target.split("#", 1)[0])
        found.append((target, (page.parent / path).resolve()))
    return found


def test_every_relative_link_resolves():
    broken = [f"{page.relative_to(REPO)}: {target}" for page in _pages() for target, path in _links(page)
              if not path.exists()]  # fmt: skip
    assert broken == []


def test_every_file_under_docs_is_reachable_from_the_readme():
    seen, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for _, path in _links(page):
            if path.is_dir() and (path / "README.md").exists():
                path = path / "README.md"
            if path.suffix == ".md" and path.exists() and REPO in path.parents:
                todo.append(path)  # seen once visited
            else:
                seen.add(path)
    pages = [p for p in seen if p.suffix == ".md" and p.exists()]
    texts = "\n".join(p.read_text() for p in pages)

    def reachable(file: Path) -> bool:
        beside = any(file.parent == p.parent and (file.stem == p.stem or file.stem.startswith(p.stem + "-"))
                     for p in pages)  # fmt: skip
        return file.resolve() in seen or beside or str(file.relative_to(REPO)) in texts

    orphans = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "docs").rglob("*"))
        if p.is_file() and not reachable(p)
    ]
    assert orphans == []


MACHINE_PATH = re.compile(r"(?<![\w.$~-])/(?:tmp|root|home|work|Users|mnt|scratch|data)/[\w.+-]")


def test_committed_figures_record_no_machine_paths():
    """Reports and ledgers committed under docs/ and experiments/ name files relative to the
    repository or by a placeholder ($OUT, $STAGE, $EVAL_DIR), never by one machine's absolute path
    (a GPU machine's staging folder, a temporary evaluation folder)."""
    root = Path(__file__).resolve().parents[1]
    found = [f"{path.relative_to(root)}: {match.group(0)}" for folder in ("docs", "experiments")
             for path in (root / folder).rglob("*.json") for match in MACHINE_PATH.finditer(path.read_text())]  # fmt: skip
    assert not found, found[:10]
