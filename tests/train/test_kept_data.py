"""The committed kept dataset (data/smollm2-kept, issue 36): every file matches its manifest, it
was distilled from the embedded target itself, the held-out conversations are not trained on,
and `headstart train` reads it as it is (no GPU, no re-distillation)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

KEPT = Path(__file__).resolve().parents[2] / "data" / "smollm2-kept"
SOURCES = ("sgeval", "sg", "sgv3", "gsm8k", "datafree")
HELD_OUT_FIRST_ROW = 2858  # rows 2858-2953 of sg_90k: the shipped heads' held-out set

pytestmark = pytest.mark.skipif(not KEPT.is_dir(), reason="data/smollm2-kept is not in this checkout")


def _column(source: str, name: str) -> list:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headstart.distill.store import packed_paths

    return pa.concat_tables([pq.read_table(p, columns=[name]) for p in packed_paths(KEPT / source)])[
        name
    ].to_pylist()


def test_every_source_matches_its_manifest_and_the_totals_add_up():
    from headstart.distill.pack import verify

    counts = {source: verify(KEPT / source)["records"] for source in SOURCES}
    manifest = json.loads((KEPT / "kept.json").read_text())
    assert manifest["records"] == counts and manifest["total"] == sum(counts.values())
    assert sum(counts.values()) >= 30_000  # the size


def test_it_was_distilled_from_the_embedded_target():
    from headstart.targets.gguf import embedded_gguf_path

    digest = hashlib.sha256(embedded_gguf_path().read_bytes()).hexdigest()
    for source in SOURCES:
        meta = json.loads((KEPT / source / "distill_meta.json").read_text())
        assert meta["fingerprint"]["sha256"] == digest, source
        assert meta["settings"]["temperature"] == 0.0 and meta["settings"]["max_new_tokens"] == 128


def test_the_held_out_rows_are_not_trained_on():
    held_out, trained = _column("sgeval", "index"), _column("sg", "index")
    assert len(held_out) == 96 and min(held_out) >= HELD_OUT_FIRST_ROW > max(trained)


def test_train_reads_it_as_committed():
    from headstart.config import load_config
    from headstart.train.config import TrainConfig
    from headstart.train.data import load_distilled_data

    paths = ",".join(str(KEPT / s) for s in SOURCES[1:])
    cfg = load_config(TrainConfig, None, [f"data.path=[{paths}]", "data.max_records=50",
                                          "data.max_records_from=each"])  # fmt: skip
    data = load_distilled_data(cfg.data)
    assert len(data) == 50 and all(
        0 < sum(mask) < len(ids) for ids, mask in zip(data.input_ids, data.loss_mask, strict=True)
    )


LONG = ("sglong-eval", "sgv3long", "sglong")  # issue 69: first turns over 256 tokens, replies up to 512
V3_HELD_OUT_FIRST_ROW = 800  # ShareGPT_V3 rows 800+: sglong-eval's; sgv3long stops before them


def test_the_long_context_sets_match_their_manifest_and_hold_out_their_rows():
    """The long-context sets (experiments/smollm2-long/distill_long.sh): long first turns only,
    the embedded target's replies up to 512 tokens, the held-out rows apart from the trained."""
    from headstart.distill.pack import verify
    from headstart.targets.gguf import embedded_gguf_path

    present = [s for s in LONG if (KEPT / s).is_dir()]
    assert "sglong-eval" in present
    manifest = json.loads((KEPT / "kept.json").read_text())["long"]
    written = [s for s in SELF_WRITTEN if (KEPT / s).is_dir()]
    assert manifest["records"] == {s: verify(KEPT / s)["records"] for s in present + written}
    digest = hashlib.sha256(embedded_gguf_path().read_bytes()).hexdigest()
    for source in present:
        meta = json.loads((KEPT / source / "distill_meta.json").read_text())
        settings = meta["settings"]
        assert meta["fingerprint"]["sha256"] == digest and settings["temperature"] == 0.0
        assert settings["max_new_tokens"] == 512 and settings["min_prompt_tokens"] == 257
        ids, replies = _column(source, "input_ids"), _column(source, "reply_tokens")
        assert all(len(i) - n > 256 for i, n in zip(ids, replies, strict=True))  # long prompts only
    assert min(_column("sglong-eval", "index")) >= V3_HELD_OUT_FIRST_ROW
    if "sgv3long" in present:
        assert max(_column("sgv3long", "index")) < V3_HELD_OUT_FIRST_ROW
    if "sglong" in present:  # sg_90k's long rows, all before its held-out rows
        assert max(_column("sglong", "index")) < HELD_OUT_FIRST_ROW


SELF_WRITTEN = ("sgfollow", "sgdocs")  # issue 69: the target's own follow-up turns and documents


def test_the_self_written_long_sets_are_the_targets_greedy_conversations_before_the_held_out_rows():
    """sgfollow (the target writes 3 more user turns and answers each) and sgdocs (it writes a
    document, then answers a task about it): the embedded target's, greedy replies, sg_90k rows
    before the held-out ones, several replies a self-conversation, one a document task."""
    from headstart.targets.gguf import embedded_gguf_path

    digest = hashlib.sha256(embedded_gguf_path().read_bytes()).hexdigest()
    for source, key, value in (("sgfollow", "followups", 3), ("sgdocs", "documents", 768)):
        if not (KEPT / source).is_dir():
            continue
        meta = json.loads((KEPT / source / "distill_meta.json").read_text())
        assert meta["fingerprint"]["sha256"] == digest and meta["settings"]["temperature"] == 0.0
        assert meta["settings"][key] == value
        assert max(_column(source, "index")) < HELD_OUT_FIRST_ROW
        replies = [sum(1 for i in range(len(m)) if m[i] and (i + 1 == len(m) or not m[i + 1]))
                   for m in _column(source, "loss_mask")]  # fmt: skip
        if source == "sgfollow":
            assert sum(replies) / len(replies) > 2  # most conversations hold their follow-ups
        else:
            assert set(replies) == {1}  # the document is context, the task's answer the one reply
