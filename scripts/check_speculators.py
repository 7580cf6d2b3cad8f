#!/usr/bin/env python
"""An outside reader for `headstart export --format speculators`: vLLM's `speculators` package.

Two halves, two virtualenvs (speculators pins its own transformers):
1. here (headstart's venv): greedy continuations of held-out prompts by the target, with the aux
   hidden states the export names (engines' ids: the input of decoder layer i = HF hidden_states[i]);
2. `--inner` (run by 1 with --python, e.g. a venv made by `pip install torch==2.13.0 speculators`):
   the export must load with its own class and no missing or unexpected tensor, then its own
   forward drafts on those features:
   - eagle3 (`Eagle3DraftModel`): step 0; top-1 = how often its draft (mapped through d2t) is
     the target's next greedy token, over the continuation tokens;
   - dflash (`DFlashDraftModel`): a block at every continuation position speculators' anchor
     sampler allows; per block slot, the agreement of its argmax with headstart's own block
     draft at the same anchor, and its top-1 against the target's continuation.

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
    from headstart.targets import load_target

    config = json.loads((Path(args.export) / "config.json").read_text())
    if config.get("speculators_model_type") == "dflash":
        return dflash_features(args, out, config)
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


def dflash_features(args: argparse.Namespace, out: Path, config: dict) -> None:
    """DFlash: the continuations, their aux hidden states, and headstart's block draft (argmax per
    slot) anchored at every continuation position."""
    import torch
    from safetensors.torch import save_file

    from headstart.bench.questions import load_questions
    from headstart.heads import load_heads
    from headstart.targets import load_target

    aux = config["aux_hidden_state_layer_ids"]
    target = load_target(args.target)
    head = load_heads(args.export, target)  # headstart's import of the same directory
    size = head.block_size
    tensors = {
        "embed": target.model.get_input_embeddings().weight.detach().clone(),
        "lm_head": target.model.get_output_embeddings().weight.detach().clone(),
    }
    for n, question in enumerate(load_questions(args.prompts, limit=args.limit)):
        prompt = target.chat.user_prompt_ids(question.turns[0])
        ids = torch.tensor([prompt])
        with torch.no_grad():
            full = target.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False,
                pad_token_id=target.tokenizer.pad_token_id,
            )  # fmt: skip
            states = target.model(full, output_hidden_states=True).hidden_states
            length = full.shape[1]
            g = head.fuse(states[-1], {i - 1: states[i] for i in aux})  # (1, T, H)
            drafts = torch.full((length, size - 1), -1, dtype=torch.long)
            for a in range(len(prompt), length):  # headstart's own block at every anchor
                cache = head.new_cache()
                head.add_context(g[:, :a], torch.arange(a)[None], cache)
                block = head.draft_block(
                    full[:, a], torch.tensor([a]), torch.ones(1, a, dtype=torch.bool), cache
                )
                drafts[a] = head.draft_to_target(head.logits(block[0, 1:]).argmax(-1))
        tensors[f"{n}.ids"] = full[0]
        tensors[f"{n}.hidden"] = torch.cat([states[i][0] for i in aux], dim=-1)  # (T, A*H)
        tensors[f"{n}.start"] = torch.tensor(len(prompt))
        tensors[f"{n}.headstart"] = drafts
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out))


def loading_problems(model: object, export: str) -> dict:
    """The model's own key set against the file's: what it would leave at init, what it would ignore."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(Path(export) / "model.safetensors"))
    # the verifier's modules are not the draft's; a full-vocabulary DFlash draft reads its lm_head too
    skip = ("verifier_", "embed_tokens") + (() if "lm_head.weight" in saved else ("lm_head",))
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(skip)}
    bad = {
        "missing": sorted(set(own) - set(saved)),
        "unexpected": sorted(set(saved) - set(own)),
        "shape": sorted(k for k in set(own) & set(saved) if own[k].shape != saved[k].shape),
        "not_loaded": sorted(
            k for k in set(own) & set(saved) if not torch.equal(own[k].to(saved[k].dtype), saved[k])
        ),
    }
    return {k: v for k, v in bad.items() if v}


def inner_dflash(args: argparse.Namespace) -> None:
    """speculators' DFlashDraftModel on the same features: its `_backbone_forward` (the training
    forward, every allowed anchor at once) gives each block's per-slot logits."""
    import torch
    from safetensors.torch import load_file
    from speculators.models.dflash import DFlashDraftModel

    model = DFlashDraftModel.from_pretrained(args.export)
    bad = loading_problems(model, args.export)
    data = load_file(args.features)
    model = model.float().eval()
    reduced = model.d2t is not None  # a draft vocabulary: its own lm_head rows, ids mapped by d2t
    with torch.no_grad():  # the target's, as vLLM shares them (the verifier is not reachable here)
        model.embed_tokens.weight.copy_(data["embed"])
        if not reduced:
            model.lm_head.weight.copy_(data["lm_head"])
    size = model.block_size
    same = torch.zeros(size - 1)
    hits = torch.zeros(size - 1)
    total = torch.zeros(size - 1)
    for n in range(len([k for k in data if k.endswith(".ids")])):
        ids, hidden, start = data[f"{n}.ids"], data[f"{n}.hidden"], int(data[f"{n}.start"])
        length = ids.numel()
        loss_mask = torch.zeros(1, length, dtype=torch.long)
        loss_mask[:, start:] = 1
        with torch.no_grad():
            _, logits, _, _, blocks = model._backbone_forward(
                hidden[None].float(), ids[None], loss_mask, torch.zeros(1, length, hidden.shape[-1] // len(
                    model.config.aux_hidden_state_layer_ids)), torch.zeros(1, length, dtype=torch.long),
                max_anchors=length,
            )  # fmt: skip
        real = int(loss_mask[0, :-size].sum())  # select_anchors: every allowed anchor first, then padding
        anchors = blocks[::size][:real]
        drafts = logits[0].argmax(-1)
        if reduced:
            drafts = drafts + model.d2t[drafts]  # draft ids -> target ids
        drafts = drafts.view(-1, size)[:real, 1:]  # (N, S-1)
        for slot in range(size - 1):
            at = anchors + 1 + slot
            inside = at < length
            ours = data[f"{n}.headstart"][anchors, slot]
            same[slot] += float(((drafts[:, slot] == ours) & inside).sum())
            hits[slot] += float(((drafts[:, slot] == ids[at.clamp_max(length - 1)]) & inside).sum())
            total[slot] += float(inside.sum())
    report = {
        "loading_problems": bad,
        "agreement_with_headstart_per_slot": [round(float(x), 4) for x in same / total.clamp_min(1)],
        "top1_per_slot": [round(float(x), 4) for x in hits / total.clamp_min(1)],
        "blocks_per_slot": [int(x) for x in total],
    }
    print(json.dumps(report))


def inner(args: argparse.Namespace) -> None:
    """Runs under the speculators venv: nothing from headstart is imported."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((Path(args.export) / "config.json").read_text())
    if config.get("speculators_model_type") == "dflash":
        return inner_dflash(args)
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(args.export)
    bad = loading_problems(model, args.export)
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


def local_verifier(export: Path, target: str, into: Path) -> Path:
    """The export as speculators reads it here: speculators loads the verifier's embeddings and
    lm_head from `verifier.name_or_path`, which an export names portably (a Hub id) and this
    machine may not reach. A copy (links) whose config names the target's local folder instead."""
    from headstart.targets import load_target

    local = load_target(target).model.config._name_or_path
    config = json.loads((export / "config.json").read_text())
    verifier = config.get("speculators_config", {}).get("verifier") or {}
    if not local or not Path(local).is_dir() or Path(str(verifier.get("name_or_path"))).is_dir():
        return export
    into.mkdir()
    for item in export.iterdir():
        if item.name != "config.json":
            (into / item.name).symlink_to(item.resolve())
    verifier["name_or_path"] = local
    (into / "config.json").write_text(json.dumps(config, indent=2))
    return into


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
        export = local_verifier(Path(args.export), args.target, Path(tmp) / "export")
        cmd = [args.python, __file__, "--inner", "--export", str(export), "--features", str(file)]
        result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        print(result.stderr[-3000:], file=sys.stderr)
        return result.returncode
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=2))
    return 0 if not report["loading_problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
