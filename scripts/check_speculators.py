#!/usr/bin/env python
"""An outside reader for `headstart export --format speculators`: vLLM's `speculators` package.

Two halves, two virtualenvs (speculators pins its own transformers):
1. here (headstart's venv): greedy continuations of held-out prompts by the target, with the aux
   hidden states the export names (engines' ids: the input of decoder layer i = HF hidden_states[i]);
2. `--inner` (run by 1 with --python, e.g. a venv made by `pip install torch==2.13.0 speculators`):
   `Eagle3DraftModel.from_pretrained(EXPORT)` must load with no missing or unexpected tensor, then
   its own forward drafts step 0 on those features; top-1 = how often its draft (mapped through
   d2t) is the target's next greedy token, over the continuation tokens.

    python scripts/check_speculators.py --export runs/exported/speculators \\
        --prompts ../shared/data/eval/mt_bench/question.jsonl --limit 16 --python /work/spec-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def features(args: argparse.Namespace, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from headstart.bench.questions import load_questions
    from headstart.heads import load_heads
    from headstart.target import load_target

    config = json.loads((Path(args.export) / "config.json").read_text())
    aux = config["eagle_aux_hidden_state_layer_ids"]
    target = load_target(args.target)
    head = load_heads(args.export, target)  # headstart's import of the same directory
    tensors = {"embed": target.model.get_input_embeddings().weight.detach().clone()}
    questions = load_questions(args.prompts, limit=args.limit)
    for n, question in enumerate(questions):
        prompt = target.chat.user_prompt_ids(question.turns[0])
        ids = torch.tensor([prompt])
        with torch.no_grad():
            full = target.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False,
                pad_token_id=target.tokenizer.pad_token_id,
            )  # fmt: skip
            states = target.model(full, output_hidden_states=True).hidden_states
        tensors[f"{n}.ids"] = full[0]
        tensors[f"{n}.hidden"] = torch.cat([states[i][0] for i in aux], dim=-1)  # (T, 3H)
        tensors[f"{n}.start"] = torch.tensor(len(prompt))
        steps = full.shape[1] - 1
        with torch.no_grad():  # headstart's own step-0 drafts on the same inputs, for agreement
            fused = head.fuse(states[-1], {i - 1: states[i] for i in aux})[:, :steps]
            g = head(fused, full[:, 1:], position_ids=torch.arange(1, steps + 1)[None])
            tensors[f"{n}.headstart"] = head.draft_to_target(head.logits(g).argmax(-1))[0]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out))


def inner(args: argparse.Namespace) -> None:
    """Runs under the speculators venv: nothing from headstart is imported."""
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(args.export)
    # its own key set against the file's: what it would leave at init, what it would ignore
    saved = load_file(str(Path(args.export) / "model.safetensors"))
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(("verifier_", "embed_tokens"))}
    bad = {
        "missing": sorted(set(own) - set(saved)),
        "unexpected": sorted(set(saved) - set(own)),
        "shape": sorted(k for k in set(own) & set(saved) if own[k].shape != saved[k].shape),
        "not_loaded": sorted(
            k for k in set(own) & set(saved) if not torch.equal(own[k].to(saved[k].dtype), saved[k])
        ),
    }
    bad = {k: v for k, v in bad.items() if v}
    data = load_file(args.features)
    model = model.float().eval()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(data["embed"])  # vLLM shares the target's embeddings too
    hits = total = same = 0
    for n in range(len([k for k in data if k.endswith(".ids")])):
        ids, hidden, start = data[f"{n}.ids"], data[f"{n}.hidden"], int(data[f"{n}.start"])
        steps = ids.numel() - 1  # (g_t, x_{t+1}) -> x_{t+2}: speculators' shift_batch alignment
        with torch.no_grad():
            drafts = model(
                hidden_states=hidden[None, :steps].float(),
                input_ids=ids[None, 1:],
                document_ids=torch.zeros(1, steps, dtype=torch.long),
                position_ids=torch.arange(1, steps + 1)[None],
                ttt_steps=1,
            )[0][0]  # draft-vocabulary ids, (steps,)
        if model.d2t is not None:
            drafts = drafts + model.d2t[drafts]
        # score the continuation: positions whose next-next token the target generated
        got, want = drafts[start - 1 : steps - 1], ids[start + 1 :]
        hits += int((got == want).sum())
        same += int((got == data[f"{n}.headstart"][start - 1 : steps - 1]).sum())
        total += want.numel()
    report = {"loading_problems": bad, "step0_top1": hits / total, "agreement_with_headstart": same / total}
    print(json.dumps({**report, "tokens": total}))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--export", required=True, help="directory written by headstart export --format speculators"
    )
    parser.add_argument("--prompts", help="questions file (MT-bench jsonl, HumanEval, ...)")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--python", help="the speculators venv's python")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--features", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "features.safetensors"
        features(args, file)
        cmd = [args.python, __file__, "--inner", "--export", args.export, "--features", str(file)]
        result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        print(result.stderr[-3000:], file=sys.stderr)
        return result.returncode
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=2))
    return 0 if not report["loading_problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
