"""Run several decoding methods over the same prompts, interleaved prompt by prompt.

Interleaving (every method on prompt 1, then every method on prompt 2, ...) exposes all methods to
the same machine noise, so ratios measured in one run are meaningful on a shared CPU. Multi-turn
questions interleave turn by turn, each method continuing its own conversation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from headstart import kinds
from headstart.bench.methods import Method, Run
from headstart.bench.questions import Question


def is_drafting(name: str) -> bool:
    """Whether a method drafts: heads (`headstart:`), draft models (`draft:`) and the baselines of
    the registered drafters with nothing to train (lookahead, early_exit)."""
    return name.startswith(("headstart:", "draft:", *(kind.baseline for kind in kinds.DRAFT_KINDS.values())))


@dataclass
class Record:
    question_id: str
    turn: int
    category: str
    method: str
    token_ids: list[int]
    new_tokens: int
    target_forwards: int
    wall_s: float
    accept_lengths: list[int]
    by_position: dict[str, list[int]] = field(default_factory=dict)  # records from before it: none

    @classmethod
    def of(cls, question: Question, turn: int, method: str, run: Run) -> Record:
        return cls(
            question.question_id,
            turn,
            question.category,
            method,
            run.token_ids,
            len(run.token_ids),
            run.target_forwards,
            run.wall_s,
            run.accept_lengths,
            run.by_position,
        )


PromptFn = Callable[[Question, list[list[int]]], list[int]]
"""Prompt ids of a question's next turn, given one method's own answers (new token ids) so far."""


def _warm_up(methods: dict[str, Method], questions: list[Question], prompt: PromptFn) -> None:
    """Run every method once on the first turn of the first questions (64 prompt tokens at most)."""
    for question in questions:
        for method in methods.values():
            method(prompt(question, [])[:64])


def partial_path(outputs: Path) -> Path:
    """Where a run appends its records until every prompt ran (then renamed to `outputs`)."""
    return outputs.with_name(outputs.name + ".partial")


def finished_questions(outputs: Path, methods: dict[str, Method], questions: list[Question]) -> list[Record]:
    """Records of an interrupted run (its `.partial` file) for the questions it finished: every turn
    answered by every one of `methods`. A question cut off halfway is measured again, whole."""
    tmp = partial_path(outputs)
    if not tmp.is_file():
        return []
    records = []
    for line in tmp.read_text().splitlines():
        try:
            records.append(Record(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            break  # a line cut off by the interruption ends the usable part
    wanted = {q.question_id: {(t, m) for t in range(1, len(q.turns) + 1) for m in methods} for q in questions}
    got: dict[str, set[tuple[int, str]]] = {}
    for record in records:
        got.setdefault(record.question_id, set()).add((record.turn, record.method))
    done = {qid for qid, keys in got.items() if qid in wanted and keys == wanted[qid]}
    return [r for r in records if r.question_id in done]


def run_bench(
    methods: dict[str, Method],
    questions: list[Question],
    prompt: PromptFn,
    outputs: Path,
    warmup: int = 1,
    done: list[Record] | None = None,
) -> list[Record]:
    """Warm every method up, then measure every turn of each question with every method; append
    to `outputs`. Turn by turn across methods: every method answers turn 1, then every method
    answers turn 2 after its OWN turn-1 answer (the MT-bench protocol), then the next question.
    `done`: records of questions an interrupted run finished (`finished_questions`); they are kept
    and those questions are not measured again."""
    records: list[Record] = list(done or [])
    skip = {r.question_id for r in records}
    todo = [q for q in questions if q.question_id not in skip]
    _warm_up(methods, (todo or questions)[:warmup], prompt)
    outputs.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(outputs)
    total = sum(len(q.turns) for q in questions) * len(methods)
    started = time.perf_counter()
    # initial=: resumed runs count as done without skewing the bar's rate and time left
    with tmp.open("w") as handle, tqdm(total=total, initial=len(records), desc="bench", unit="run") as bar:
        for record in records:  # rewritten first, so a second interruption keeps them too
            handle.write(json.dumps(record.__dict__) + "\n")
        handle.flush()
        for index, question in enumerate(todo):
            answers: dict[str, list[list[int]]] = {name: [] for name in methods}
            for turn in range(1, len(question.turns) + 1):
                for name, method in methods.items():
                    bar.set_postfix_str(f"{name} q{question.question_id} t{turn}")
                    record = Record.of(question, turn, name, method(prompt(question, answers[name])))
                    answers[name].append(record.token_ids)
                    records.append(record)
                    handle.write(json.dumps(record.__dict__) + "\n")
                    handle.flush()
                    bar.update(1)
            if index == 0 and len(todo) > 1:
                per_question = time.perf_counter() - started
                bar.write(f"estimated time: ~{per_question * (len(todo) - 1) / 60:.1f} min more")
    tmp.replace(outputs)  # complete file only once every prompt ran
    return records


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(records: list[Record], greedy: bool) -> dict[str, Any]:
    """Per-method figures: tokens/s, speedup vs vanilla (and vs plain for heads), tau,
    identical_fraction, totals."""
    by_method: dict[str, list[Record]] = {}
    for record in records:
        by_method.setdefault(record.method, []).append(record)
    reference = {(r.question_id, r.turn): r.token_ids for r in by_method.get("vanilla", [])}
    summary: dict[str, Any] = {}
    for name, rows in by_method.items():
        new = sum(r.new_tokens for r in rows)
        wall = sum(r.wall_s for r in rows)
        forwards = sum(r.target_forwards for r in rows)
        speculative = is_drafting(name)
        same = [r.token_ids == reference[key] for r in rows if (key := (r.question_id, r.turn)) in reference]
        summary[name] = {
            "tokens_per_s": new / wall if wall else 0.0,
            "speedup": None,
            # tau: mean tokens committed per verify forward, bonus token included (drafters only;
            # the prefill forward, which commits the first token, is not a verify step)
            "tau": _mean([n for r in rows for n in r.accept_lengths]) if speculative else None,
            "tokens_per_forward": new / forwards if forwards else None,
            "identical_fraction": (sum(same) / len(same)) if greedy and same else None,
            "new_tokens": new,
            "target_forwards": forwards,
            "wall_s": wall,
            "prompts": len(rows),
        }
    base = summary.get("vanilla", {}).get("tokens_per_s")
    # over_plain: against headstart's own forward without drafts (the `plain` baseline), so the
    # speculation's share of a speed-up stands apart from the CPU kernels' share
    plain = summary.get("plain", {}).get("tokens_per_s")
    for name, figures in summary.items():
        figures["speedup"] = figures["tokens_per_s"] / base if base else None
        speculative = is_drafting(name)
        figures["over_plain"] = figures["tokens_per_s"] / plain if plain and speculative else None
    return summary
