#!/usr/bin/env python
"""headstart's distilled records + cached features -> the layout speculators 0.9.0 trains from offline.

Two steps, around speculators' own `prepare-data` (which takes pre-tokenized rows as they are):

  1. python convert.py jsonl --out runs/spec/jsonl
       writes train.jsonl (the 600 sg600 records) and eval.jsonl (the 96 sgeval records), each line
       {"input_ids", "loss_mask"} exactly as headstart stored them (chat template already applied,
       loss_mask 1 on the assistant reply). Then (speculators' CLI, see NOTES.md):
         speculators prepare-data --model TARGET --data jsonl/train.jsonl --output prep/train \
             --seq-length 384 --no-skip-token-freq --num-preprocessing-workers 1
         speculators prepare-data --model TARGET --data jsonl/eval.jsonl --output prep/eval \
             --seq-length 384 --num-preprocessing-workers 1

  2. python convert.py assemble --prep runs/spec/prep --out runs/spec/specdata
       concatenates prep/train (600 rows, shuffled by prepare-data) then prep/eval (96 rows) into one
       `datasets` directory (speculators splits train/val by row index: --train-data-ratio 0.8621
       gives int(696 * 0.8621) = 600 train rows, the 96 held-out rows as its validation split),
       copies prep/train/token_freq.pt (reply-token counts of the 600 training records only), and
       writes specdata/hidden_states/hs_<row>.safetensors per row:
         token_ids      (T,)        int64, = the row's input_ids
         hidden_states  (T, 4, 576) float32: [layer1, layer14, layer26, last / w_norm]
       speculators reads hidden_states[:, :-1] as the aux states (aux ids 2, 15, 27 = inputs of
       decoder layers 2, 15, 27 = outputs of layers 1, 14, 26: headstart's layer1/14/26) and
       hidden_states[:, -1] as `verifier_last_hidden_states`, to which it applies the target's final
       RMSNorm (Eagle3DraftModel.verifier_norm) before the lm_head: it expects vLLM's PRE-norm final
       state. headstart caches the POST-norm state (the lm_head input) `last` = x/rms(x) * w, so we
       store u = last / w: RMSNorm(u) * w = u/sqrt(mean(u^2)+eps) * w = last / sqrt(1+eps) ~ last,
       i.e. the target's own logits (checked by check_features.py against a real forward).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# the distilled training and held-out sets (headstart distill --cache-features, layers eagle3,last)
# and the target's HF directory (the embedded GGUF dequantised: ~/.cache/headstart/gguf/<sha256>)
TRAIN = Path(os.environ.get("TRAIN", "runs/distill-smollm2-sg600"))
EVAL = Path(os.environ.get("EVAL", "runs/distill-smollm2-sgeval"))
TARGET = Path(os.environ.get("TARGET_DIR", str(Path.home() / ".cache/headstart/gguf/b179c9523d0e6a0f")))
LAYERS = ("layer1", "layer14", "layer26", "last")
MAX_LENGTH = 384


def records(root: Path) -> Iterator[dict]:
    for shard in sorted((root / "data").glob("shard-*.jsonl")):
        with shard.open() as handle:
            for line in handle:
                yield json.loads(line)


def cmd_jsonl(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, root in (("train", TRAIN), ("eval", EVAL)):
        n = tokens = reply = longest = 0
        with (out / f"{name}.jsonl").open("w") as handle:
            for r in records(root):
                assert len(r["input_ids"]) == len(r["loss_mask"])
                handle.write(json.dumps({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}) + "\n")
                n += 1
                tokens += min(len(r["input_ids"]), MAX_LENGTH)
                reply += sum(r["loss_mask"][:MAX_LENGTH])
                longest = max(longest, len(r["input_ids"]))
        print(
            f"{name}: {n} records, {tokens} tokens (<= {MAX_LENGTH} each), {reply} reply tokens, longest {longest}"
        )


def cmd_assemble(args: argparse.Namespace) -> None:
    import torch
    from datasets import concatenate_datasets, load_from_disk
    from safetensors import safe_open
    from safetensors.torch import save_file

    prep, out = Path(args.prep), Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    (out / "hidden_states").mkdir(parents=True)
    parts = [load_from_disk(str(prep / "train")), load_from_disk(str(prep / "eval"))]
    print("prepared rows:", [len(p) for p in parts])
    data = concatenate_datasets(parts)
    data.save_to_disk(str(out))
    shutil.copy(prep / "train" / "token_freq.pt", out / "token_freq.pt")

    with safe_open(str(TARGET / "model.safetensors"), framework="pt") as f:
        w = f.get_tensor("model.norm.weight").float()  # (576,), min 0.87: the division is safe

    # every headstart record, by its (truncated) token ids -> [(root, record), ...]; 20 of the 600
    # training conversations repeat another's tokens exactly (the same prompt under two ShareGPT
    # ids: same greedy reply, same features), so each key holds a queue, the training set's first
    by_ids: dict[tuple[int, ...], list[tuple[Path, dict]]] = {}
    for root in (TRAIN, EVAL):
        for r in records(root):
            by_ids.setdefault(tuple(r["input_ids"][:MAX_LENGTH]), []).append((root, r))

    handles: dict[Path, object] = {}
    started = time.time()
    rows = data.with_format(None)
    for i in range(len(rows)):
        row = rows[i]
        ids = list(row["input_ids"])
        root, r = by_ids[tuple(ids)].pop(0)
        assert root == (TRAIN if i < len(parts[0]) else EVAL)
        assert list(row["loss_mask"]) == r["loss_mask"][: len(ids)]
        path = root / r["features_file"]
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        handle = handles[path]
        feats = {name: handle.get_tensor(f"{r['index']}/{name}")[: len(ids)].float() for name in LAYERS}
        feats["last"] = feats["last"] / w  # post-norm -> a state whose RMSNorm * w is the post-norm state
        hidden = torch.stack([feats[name] for name in LAYERS], dim=1)  # (T, 4, H)
        assert hidden.shape == (len(ids), 4, 576) and torch.isfinite(hidden).all()
        save_file(
            {"token_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": hidden.contiguous()},
            str(out / "hidden_states" / f"hs_{i}.safetensors"),
        )
    assert not any(by_ids.values()), "a headstart record was not used"
    split = [(prep / name).name for name in ("train", "eval")]
    meta = {
        "rows": len(rows),
        "train_rows": len(parts[0]),
        "eval_rows": len(parts[1]),
        "order": split,
        "train_data_ratio": round((len(parts[0]) + 0.5) / len(rows), 6),
        "layers": list(LAYERS),
        "last": "headstart post-norm `last` divided by model.norm.weight",
        "dtype": "float32",
    }
    (out / "convert_meta.json").write_text(json.dumps(meta, indent=2))
    print(json.dumps(meta), f"{time.time() - started:.1f}s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("jsonl")
    p.add_argument("--out", default="runs/spec/jsonl")
    p = sub.add_parser("assemble")
    p.add_argument("--prep", default="runs/spec/prep")
    p.add_argument("--out", default="runs/spec/specdata")
    args = parser.parse_args()
    {"jsonl": cmd_jsonl, "assemble": cmd_assemble}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
