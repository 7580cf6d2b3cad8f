#!/usr/bin/env python3
"""A bench questions file of held-out long prompts beside short ones: the N longest first turns of
data/smollm2-kept/sglong-eval (ShareGPT_V3 rows 800+, over 256 tokens; never trained on), as
category "long (held-out ShareGPT)", and the first N MT-bench first turns as "short (MT-bench)".

    python experiments/smollm2-long/long_questions.py --data ../shared/data --out runs/longshort.jsonl [--n 8]
    headstart bench --target smollm2 --questions runs/longshort.jsonl --tree chain:3 --baselines vanilla ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headstart.distill import load_distilled

KEPT = Path(__file__).resolve().parents[2] / "data" / "smollm2-kept" / "sglong-eval"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data", help="the folder holding train/ and eval/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    data = Path(args.data)
    held = load_distilled(KEPT)
    prompt_tokens = [len(ids) - n for ids, n in zip(held["input_ids"], held["reply_tokens"], strict=True)]
    longest = sorted(zip(prompt_tokens, held["index"], strict=True), reverse=True)[: args.n]
    v3 = json.loads((data / "train" / "ShareGPT_V3_filtered_1000.json").read_text())
    mt = [json.loads(line) for line in (data / "eval" / "mt_bench" / "question.jsonl").read_text().splitlines()]
    with open(args.out, "w") as out:
        for row in mt[: args.n]:
            out.write(json.dumps({"question_id": 1000 + row["question_id"], "category": "short (MT-bench)",
                                  "turns": row["turns"][:1]}) + "\n")  # fmt: skip
        for tokens, index in longest:
            turn = next(c["value"] for c in v3[index]["conversations"] if c["from"] == "human")
            out.write(json.dumps({"question_id": int(index), "category": "long (held-out ShareGPT)",
                                  "turns": [turn], "prompt_tokens": tokens}) + "\n")  # fmt: skip
    print(f"{args.out}: {args.n} short, {len(longest)} long ({min(t for t, _ in longest)}-{max(t for t, _ in longest)} tokens)")


if __name__ == "__main__":
    main()
