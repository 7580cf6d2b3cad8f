"""report.json, report.md and PNG plots of a bench run."""

from __future__ import annotations

import importlib.util
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from headstart.bench.runner import Record, is_drafting, summarise
from headstart.io import atomic_write_text

log = logging.getLogger(__name__)


def build_report(config: dict[str, Any], records: list[Record], greedy: bool) -> dict[str, Any]:
    categories = sorted({r.category for r in records})
    from headstart.provenance import portable, stamp

    return {
        "config": portable(config) | {"provenance": stamp()},
        "methods": summarise(records, greedy),
        "by_category": {c: summarise([r for r in records if r.category == c], greedy) for c in categories},
        "accept_length_histogram": {
            name: dict(
                sorted(Counter(n for r in records if r.method == name for n in r.accept_lengths).items())
            )
            for name in dict.fromkeys(r.method for r in records)
            if is_drafting(name)
        },
        "by_position": {
            name: by_position(records, name)
            for name in dict.fromkeys(r.method for r in records)
            if is_drafting(name)
        },  # fmt: skip
    }


def by_position(records: list[Record], method: str) -> dict[str, dict[str, float | int]]:
    """`method`'s acceptance per context bucket (tau and first-draft rate), over its records."""
    from headstart.inference.results import by_position_figures

    counts: dict[str, list[int]] = {}
    for record in records:
        if record.method == method:
            for name, (rounds, committed, accepted) in record.by_position.items():
                total = counts.setdefault(name, [0, 0, 0])
                total[0], total[1], total[2] = total[0] + rounds, total[1] + committed, total[2] + accepted
    return by_position_figures(counts)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _provenance(cfg: dict[str, Any]) -> str:
    """Which code measured it: the headstart version and commit (reports made before they were
    stamped say so)."""
    made = cfg.get("provenance") or {}
    if not made:
        return "Measured by headstart (version and commit not recorded)."
    commit = made.get("commit") or "not from a git checkout"
    return f"Measured by headstart {made.get('headstart')}, commit {commit}" + (
        " with uncommitted changes." if made.get("dirty") else "."
    )


def _turns_note(cfg: dict[str, Any]) -> str:
    """How the prompts relate to the questions when every turn was answered."""
    if cfg.get("turns") != "all":
        return ""
    return " (every turn of each question, each method after its own earlier answers)"


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"# headstart bench: {cfg['target']} on {cfg['questions']}",
        "",
        f"{cfg['num_prompts']} prompts{_turns_note(cfg)}, max_new_tokens {cfg['max_new_tokens']}, temperature {cfg['temperature']}, "
        f"{cfg['device']} {cfg['dtype']}, {cfg['threads']} threads. tau = mean tokens committed per target "
        "forward, bonus token included; speedup vs vanilla in the same run.",
        "",
        _provenance(cfg),
        "",
    ]
    if cfg.get("trees"):
        lines += ["Trees: " + ", ".join(f"{name} `{tree}`" for name, tree in cfg["trees"].items()), ""]
    if "plain" in report["methods"]:
        lines += [
            "`plain` is headstart's own forward (KV cache, small-row CPU kernels) with no drafts; "
            "`over plain` is each head's speed-up over it, the speculation's share of the speedup.",
            "",
        ]
    header = "| category | method | tokens/s | speedup | over plain | tau | tokens/forward | identical |"
    rule = "|---|---|---:|---:|---:|---:|---:|---:|"
    lines += [header, rule]
    sections = [("**all**", report["methods"])] + list(report["by_category"].items())
    for category, methods in sections:
        for name, m in methods.items():
            lines.append(
                f"| {category} | {name} | {_fmt(m['tokens_per_s'])} | {_fmt(m['speedup'])} "
                f"| {_fmt(m.get('over_plain'))} | {_fmt(m['tau'])} "
                f"| {_fmt(m['tokens_per_forward'])} | {_fmt(m['identical_fraction'])} |"
            )
    positions = {name: rows for name, rows in report.get("by_position", {}).items() if rows}
    if positions:
        buckets = list(dict.fromkeys(b for rows in positions.values() for b in rows))
        lines += ["", "Acceptance by the round's context position: tau (bonus included) / first-draft rate "
                  "(rounds).", "", "| method | " + " | ".join(buckets) + " |", "|---|" + "---:|" * len(buckets)]  # fmt: skip
        for name, rows in positions.items():
            cells = [f"{rows[b]['tau']:.2f} / {rows[b]['first_draft_rate']:.2f} ({rows[b]['rounds']})" if b in rows
                     else "-" for b in buckets]  # fmt: skip
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rounds = {name: m["round"] for name, m in report["methods"].items() if m.get("round")}
    if rounds:
        lines += ["", f"A steady-state round, one extra prompt (--compile {cfg.get('compile', 'auto')}): "
                  "host reads, calls into compiled code, eager aten ops outside it (and by phase), ms.", "",
                  "| method | host reads | compiled calls | eager ops | by phase | ms |",
                  "|---|---:|---:|---:|---|---:|"]  # fmt: skip
        lines += [f"| {name} | {r['host_reads']} | {r['compiled_calls']} | {r['eager_ops']} | "
                  f"{', '.join(f'{k} {v:g}' for k, v in (r.get('eager_by_phase') or {}).items())} | {r['ms']} |"
                  for name, r in rounds.items()]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    """speedup_by_category.png and accept_lengths.png (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    categories = list(report["by_category"])
    methods = [m for m in report["methods"] if m != "vanilla"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories)), 4))
    width = 0.8 / max(1, len(methods))
    for i, name in enumerate(methods):
        values = [report["by_category"][c].get(name, {}).get("speedup") or 0 for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(
        [x + width * (len(methods) - 1) / 2 for x in range(len(categories))], categories, rotation=30
    )
    ax.set_ylabel("speed-up vs vanilla")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "speedup_by_category.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    paths += _plot_by_position(report, out, plt)
    hist = report["accept_length_histogram"]
    if hist:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, counts in hist.items():
            total = sum(counts.values()) or 1
            ax.plot(list(counts), [v / total for v in counts.values()], marker="o", label=name)
        ax.set_xlabel("tokens committed per target forward (bonus included)")
        ax.set_ylabel("fraction of steps")
        ax.legend()
        fig.tight_layout()
        paths.append(out / "accept_lengths.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def _plot_by_position(report: dict[str, Any], out: Path, plt: Any) -> list[Path]:
    """accept_by_position.png: tau per context bucket, a line per drafting method."""
    rows = {name: figures for name, figures in report.get("by_position", {}).items() if figures}
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, figures in rows.items():
        ax.plot(list(figures), [f["tau"] for f in figures.values()], marker="o", label=name)
    ax.set_xlabel("context position of the round (tokens)")
    ax.set_ylabel("tau (tokens per round, bonus included)")
    ax.legend()
    fig.tight_layout()
    path = out / "accept_by_position.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps(report, indent=2))
    atomic_write_text(out / "report.md", markdown(report))
    if importlib.util.find_spec("matplotlib") is None:  # an extra: the report stands without plots
        log.warning("bench: no plots (matplotlib is missing): pip install 'headstart[plots]'")
        return
    plot(report, out)
