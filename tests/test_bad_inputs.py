"""Every command's bad inputs, as a table: exit status 2, ONE line on stderr that names the flag
or file and gives the fix, no traceback, and nothing added, changed or deleted on disk.

New commands (`serve`, new head kinds) add their rows to CASES. Each row runs `headstart.cli.main`
in this process on a tiny local target (a subprocess per row would cost seconds of imports each);
`test_real_process_sample` runs a few rows as real processes, with raw non-UTF-8 bytes in argv.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headstart.cli import main

NOT_UTF8 = b"\xff\xfehello".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
PROGRESS = re.compile(r"\d+%\|")  # a tqdm bar's line


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_llama):
    """W: heads, a finished run, a finished bench, broken files of every kind (built once)."""
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    w = tmp_path_factory.mktemp("bad-inputs")
    target = load_target(str(tiny_llama))
    for kind in ("eagle3", "medusa"):
        spec = HeadSpec(kind=kind, draft_vocab_size=60 if kind == "eagle3" else 0)
        build_head(spec, target, token_counts=torch.arange(288.0)).save_pretrained(w / f"heads-{kind}")
    shutil.copytree(w / "heads-eagle3", w / "run" / "final")
    (w / "run" / "results.json").write_text("{}")
    (w / "junk").mkdir()
    (w / "repo" / ".git").mkdir(parents=True)
    (w / "lookalike").mkdir()  # a user's folder whose report.json has a bench report's keys, and no mark
    (w / "lookalike" / "report.json").write_text(
        json.dumps({"config": {"target": "x"}, "methods": {}, "by_category": {}})
    )
    (w / "lookalike" / "report.md").write_text("my notes")
    (w / "junk" / "notes.txt").write_text("mine")
    (w / "file.txt").write_text("mine")
    (w / "cwd").mkdir()
    (w / "q-list.jsonl").write_text("[1, 2, 3]\n")
    (w / "q-bytes.jsonl").write_bytes(b'{"prompt": "hello"}\n{"prompt": "a\xff"}\n')
    (w / "q3.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "count", "yes")))
    (w / "p-bytes.jsonl").write_bytes(b'{"prompt": "\xff\xfe"}\n' * 3)
    (w / "q-dup.jsonl").write_text('{"question_id": 1, "turns": ["a"]}\n{"question_id": 2, "turns": ["b"]}\n'
                                   '{"question_id": 1, "turns": ["c"]}\n')  # fmt: skip
    for name, line in {"q-turns-num": '{"turns": [1, 2]}', "q-turns-null": '{"turns": null}',
                       "q-prompt-num": '{"prompt": 5}', "q-prompt-null": '{"prompt": null}',
                       "q-nothing": '{"question_id": 3, "category": "x"}', "q-id-null": '{"question_id": null, "prompt": "a"}',
                       "q-turns-str": '{"turns": "just a string"}'}.items():  # fmt: skip
        (w / f"{name}.jsonl").write_text('{"prompt": "fine"}\n' + line + "\n")
    (w / "empty.gguf").write_bytes(b"")
    (w / "magicless.gguf").write_bytes(b"not a gguf file at all")
    (w / "trunc.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 20)
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(w / "cut.gguf"), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    whole = (w / "cut.gguf").read_bytes()
    (w / "cut.gguf").write_bytes(whole[:-1000])  # a download cut short: the header whole, the data not
    (w / "recipe-unknown.yaml").write_text(f"target: {tiny_llama}\nbatch_sise: 2\n")
    (w / "recipe-bytes.yaml").write_bytes(b"target: \xff\xfe\n")
    (w / "accelerate-bad.yaml").write_text("compute_environment: [unclosed\n")
    (w / "bad-syntax.jinja").write_text("{% for m in messages %}{{ m.content")
    (w / "raises.jinja").write_text('{{ raise_exception("boom") }}')
    (w / "bytes.jinja").write_bytes(b"{{ \xff\xfe }}")
    (w / "bytes.json").write_bytes(b"[[0], \xff]")
    shutil.copytree(w / "heads-eagle3", w / "heads-broken-weights")
    (w / "heads-broken-weights" / "model.safetensors").write_bytes(b"")
    for name, edit in {
        "no-hidden": lambda c: c.pop("hidden_size"),
        "no-target": lambda c: c.pop("target"),
        "string-number": lambda c: c.update(hidden_size="sixty-four"),
        "no-layers": lambda c: c.pop("feature_layers"),
    }.items():
        shutil.copytree(w / "heads-eagle3", w / f"bad-{name}")
        config = json.loads((w / f"bad-{name}" / "config.json").read_text())
        edit(config)
        (w / f"bad-{name}" / "config.json").write_text(json.dumps(config))
    args = ["bench", "--target", str(tiny_llama), "--heads", str(w / "heads-eagle3"), "--questions"]
    assert main([*args, str(w / "q3.jsonl"), "--baselines", "vanilla", "--max-new-tokens", "4", "-q",
                 "--output", str(w / "bench-done")]) == 0  # fmt: skip
    shutil.copytree(w / "bench-done", w / "bench-copy")
    shutil.copytree(w / "bench-done", w / "bench-bad")
    (w / "bench-bad" / "report.json").write_text("{bad")
    shutil.copytree(w / "bench-done", w / "bench-cut")  # an interrupted run: partial records, no report
    (w / "bench-cut" / "report.json").unlink()
    (w / "bench-cut" / "report.md").unlink()
    (w / "bench-cut" / "outputs.jsonl").rename(w / "bench-cut" / "outputs.jsonl.partial")
    return w


def _recipe(w: Path, target: Path, output_dir: str) -> str:
    path = w / f"recipe-{abs(hash(output_dir))}.yaml"
    if not path.is_file():
        path.write_text(
            f"target: {target}\noutput_dir: {output_dir}\nhead: {{kind: medusa}}\ndata: {{path: [{w}/nodata]}}\n"
        )
    return str(path)


E, T = "{W}/heads-eagle3", "{T}"
CASES = [
    # export: never delete what it did not write (issue 34 items 1-3, 5, 6)
    ("export into the run holding its heads", ["export", "{W}/run/final", "--target", T, "--format", "speculators", "--output", "{W}/run"], "holds the input"),
    ("export --overwrite into the run", ["export", "{W}/run/final", "--target", T, "--format", "eagle", "--output", "{W}/run", "--overwrite"], "holds the input"),
    ("export over unrelated files", ["export", E, "--target", T, "--format", "eagle", "--output", "{W}/junk"], "--output {W}/junk is not empty (notes.txt)"),
    ("export onto a file", ["export", E, "--target", T, "--format", "eagle", "--output", "{W}/file.txt"], "--output {W}/file.txt is a file"),
    ("export into /proc", ["export", E, "--target", T, "--format", "eagle", "--output", "/proc/headstart-x"], "--output /proc/headstart-x is a system directory"),
    ("export into /sys", ["export", E, "--target", T, "--format", "eagle", "--output", "/sys/headstart-x"], "--output /sys/headstart-x is a system directory"),
    ("export into the working dir", ["export", E, "--target", T, "--format", "eagle", "--output", "."], "--output . is the working directory"),
    ("export into its parent", ["export", E, "--target", T, "--format", "eagle", "--output", ".."], "--output .. holds the input"),
    ("export heads without hidden_size", ["export", "{W}/bad-no-hidden", "--target", T, "--format", "eagle", "--output", "{W}/x"], "config.json lacks 'hidden_size'"),
    ("export heads without target", ["export", "{W}/bad-no-target", "--target", T, "--format", "eagle", "--output", "{W}/x"], "config.json lacks 'target'"),
    ("export heads with a string size", ["export", "{W}/bad-string-number", "--target", T, "--format", "eagle", "--output", "{W}/x"], "'hidden_size in {W}/bad-string-number/config.json' expects int"),
    ("export heads without feature_layers", ["export", "{W}/bad-no-layers", "--target", T, "--format", "eagle", "--output", "{W}/x"], "feature_layers in {W}/bad-no-layers/config.json"),
    ("export missing heads", ["export", "{W}/nope", "--target", T, "--format", "eagle", "--output", "{W}/x"], "heads directory {W}/nope: no such directory"),
    ("export unknown format", ["export", E, "--format", "gguf", "--output", "{W}/x"], "argument --format: invalid choice"),
    # devices, text, contexts, GGUF files (items 7, 8, 10, 11)
    ("generate --device gpu", ["generate", "--target", T, "--device", "gpu", "--prompt", "hi"], "unknown --device 'gpu'"),
    ("info --device ''", ["info", "--target", T, "--device", ""], "unknown --device ''"),
    ("chat --device tpu", ["chat", "--target", T, "--device", "tpu"], "unknown --device 'tpu'"),
    ("generate non-UTF-8 prompt", ["generate", "--target", T, "--prompt", NOT_UTF8], "--prompt is not valid UTF-8"),
    ("generate second prompt not UTF-8", ["generate", "--target", T, "--prompt", "a", "--prompt", NOT_UTF8], "--prompt #2 is not valid UTF-8"),
    ("generate empty prompt", ["generate", "--target", T, "--prompt", "   "], "the prompt is empty"),
    ("generate --max-new-tokens abc", ["generate", "--target", T, "--prompt", "x", "--max-new-tokens", "abc"], "argument --max-new-tokens: invalid int value"),
    ("info --context 0", ["info", "--target", T, "--context", "0"], "--context must be >= 1"),
    ("info --context -5", ["info", "--target", T, "--context", "-5"], "--context must be >= 1"),
    ("info --context past the model", ["info", "--target", T, "--context", "100000"], "--context 100000 + 22 measured tokens exceeds the target's context of 512"),
    ("info truncated GGUF", ["info", "--target", "{W}/trunc.gguf"], "cannot read GGUF file {W}/trunc.gguf"),
    ("info GGUF cut short", ["info", "--target", "{W}/cut.gguf"], "cannot read GGUF file {W}/cut.gguf: it is truncated (its tensors need 16,"),
    ("info empty GGUF", ["info", "--target", "{W}/empty.gguf"], "cannot read GGUF file {W}/empty.gguf"),
    ("info GGUF without magic", ["info", "--target", "{W}/magicless.gguf"], "cannot read GGUF file {W}/magicless.gguf"),
    # bench (items 9, 17-19)
    ("bench a line that is a list", ["bench", "--target", T, "--questions", "{W}/q-list.jsonl", "--output", "{W}/b"], "{W}/q-list.jsonl:1 is a JSON list, not an object"),
    ("bench a line not UTF-8", ["bench", "--target", T, "--questions", "{W}/q-bytes.jsonl", "--output", "{W}/b"], "{W}/q-bytes.jsonl:2 is not UTF-8"),
    ("bench --limit -1", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--limit", "-1", "--output", "{W}/b"], "--limit must be >= 1, got -1"),
    ("bench --limit 0", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--limit", "0", "--output", "{W}/b"], "--limit must be >= 1, got 0"),
    ("bench a shard with no question", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--shard", "4/4", "--output", "{W}/b"], "--shard 4/4 selects no question"),
    ("bench a bad shard", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--shard", "²/4", "--output", "{W}/b"], "bad --shard '²/4'"),
    ("bench a repeated question_id", ["bench", "--target", T, "--questions", "{W}/q-dup.jsonl", "--output", "{W}/b"], "{W}/q-dup.jsonl:3 repeats question_id 1 (first on line 1)"),
    ("bench turns of numbers", ["bench", "--target", T, "--questions", "{W}/q-turns-num.jsonl", "--output", "{W}/b"], "{W}/q-turns-num.jsonl:2: 'turns' must be a non-empty list of non-empty strings, got [1, 2]"),
    ("bench turns null", ["bench", "--target", T, "--questions", "{W}/q-turns-null.jsonl", "--output", "{W}/b"], "{W}/q-turns-null.jsonl:2: 'turns' must be a non-empty list"),
    ("bench turns a string", ["bench", "--target", T, "--questions", "{W}/q-turns-str.jsonl", "--output", "{W}/b"], "{W}/q-turns-str.jsonl:2: 'turns' must be a non-empty list"),
    ("bench prompt a number", ["bench", "--target", T, "--questions", "{W}/q-prompt-num.jsonl", "--output", "{W}/b"], "{W}/q-prompt-num.jsonl:2: 'prompt' must be a non-empty string, got 5"),
    ("bench prompt null", ["bench", "--target", T, "--questions", "{W}/q-prompt-null.jsonl", "--output", "{W}/b"], "{W}/q-prompt-null.jsonl:2: 'prompt' must be a non-empty string, got null"),
    ("bench a row with no prompt", ["bench", "--target", T, "--questions", "{W}/q-nothing.jsonl", "--output", "{W}/b"], "{W}/q-nothing.jsonl:2: no 'turns' nor any of"),
    ("bench question_id null", ["bench", "--target", T, "--questions", "{W}/q-id-null.jsonl", "--output", "{W}/b"], "{W}/q-id-null.jsonl:2: 'question_id' must be a non-empty string or an integer, got null"),
    ("bench over an interrupted run", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--output", "{W}/bench-cut"], "{W}/bench-cut holds an interrupted bench run (6 answers measured)"),
    ("bench over a finished run", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--output", "{W}/bench-done"], "{W}/bench-done already holds a finished bench report"),
    ("bench --resume, other settings", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--max-new-tokens", "9", "--resume", "--output", "{W}/bench-done"], "other settings (max_new_tokens, heads, methods)"),
    ("bench into unrelated files", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--output", "{W}/junk"], "--output {W}/junk is not empty (notes.txt)"),
    ("bench onto a file", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--output", "{W}/file.txt"], "--output {W}/file.txt is a file"),
    ("bench unknown baseline", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--baselines", "vanila", "--output", "{W}/b"], "unknown baseline(s) ['vanila']"),
    ("bench missing questions", ["bench", "--target", T, "--questions", "{W}/nope.jsonl", "--output", "{W}/b"], "questions not found: {W}/nope.jsonl"),
    ("bench merge into a shard", ["bench", "--merge", "{W}/bench-done", "--output", "{W}/bench-done"], "is one of the --merge directories"),
    # distill (items 4, 14)
    ("distill ftp base url", ["distill", "--target", T, "--engine", "openai", "--base-url", "ftp://example.com/v1", "--model", "m", "--out", "{W}/d"], "--base-url 'ftp://example.com/v1' must be an http:// or https:// URL"),
    ("distill base url without scheme", ["distill", "--target", T, "--engine", "openai", "--base-url", "localhost:8000/v1", "--model", "m", "--out", "{W}/d"], "--base-url 'localhost:8000/v1' must be an http"),
    ("distill onto a file", ["distill", "--target", T, "--out", "{W}/file.txt/d"], "--out {W}/file.txt/d: {W}/file.txt is a file"),
    ("distill into unrelated files", ["distill", "--target", T, "--prompts", "{W}/q3.jsonl", "--out", "{W}/junk", "--max-prompt-tokens", "64"], "{W}/junk exists, is not empty and is not a distill output"),
    ("distill into /proc", ["distill", "--target", T, "--out", "/proc/headstart-x"], "--out /proc/headstart-x is a system directory"),
    ("distill --num 0", ["distill", "--target", T, "--num", "0", "--out", "{W}/d"], "--num must be >= 1, got 0"),
    ("distill no usable row", ["distill", "--target", T, "--prompts", "{W}/p-bytes.jsonl", "--out", "{W}/d", "--max-prompt-tokens", "64"], "has no usable row (line is not UTF-8: 3)"),
    ("distill missing prompts", ["distill", "--target", T, "--prompts", "{W}/nope.jsonl", "--out", "{W}/d", "--max-prompt-tokens", "64"], "{W}/nope.jsonl"),
    # train, tune, push
    ("train missing recipe", ["train", "--recipe", "{W}/nope.yaml"], "recipe file not found: {W}/nope.yaml"),
    ("train misspelt key", ["train", "--recipe", "{W}/recipe-unknown.yaml"], "unknown config key 'batch_sise'; did you mean 'batch_size'?"),
    ("train into unrelated files", ["train", "--recipe", "{RECIPE:{W}/junk}"], "output_dir {W}/junk is not empty (notes.txt) and holds no headstart training run"),
    ("train onto a file", ["train", "--recipe", "{RECIPE:{W}/file.txt}"], "output_dir {W}/file.txt is a file"),
    ("train over a finished run", ["train", "--recipe", "{RECIPE:{W}/run}"], "{W}/run already holds a finished training run"),
    ("train --time-budget abc", ["train", "--recipe", "{W}/recipe-unknown.yaml", "--time-budget", "abc"], "argument --time-budget: invalid duration value: 'abc'"),
    ("train --time-budget 0", ["train", "--recipe", "{W}/recipe-unknown.yaml", "--time-budget", "0"], "argument --time-budget: invalid duration value: '0'"),
    ("tune missing heads", ["tune", "--target", T, "--heads", "{W}/nope"], "--heads {W}/nope: no such directory"),
    ("tune --limit 0", ["tune", "--target", T, "--heads", E, "--limit", "0"], "--limit must be >= 1"),
    ("push not heads", ["push", "{W}/junk", "org/name"], "{W}/junk is not a heads directory"),
    ("unknown command", ["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
    # a new user's probes of the same classes (issue 34, second pass)
    ("generate --threads 100000", ["generate", "--target", T, "--prompt", "hi", "--threads", "100000"], "--threads must be in 0.."),
    ("generate --seed 2**80", ["generate", "--target", T, "--prompt", "hi", "--seed", str(2**80)], "--seed must be in 0..2**63-1"),
    ("chat template that does not compile", ["generate", "--target", T, "--prompt", "hi", "--chat-template", "{W}/bad-syntax.jinja"], "--chat-template {W}/bad-syntax.jinja failed"),
    ("chat template that raises", ["info", "--target", T, "--chat-template", "{W}/raises.jinja"], "TemplateError: boom"),
    ("chat template not UTF-8", ["generate", "--target", T, "--prompt", "hi", "--chat-template", "{W}/bytes.jinja"], "is not UTF-8 text"),
    ("tree file not UTF-8", ["generate", "--target", T, "--heads", E, "--prompt", "hi", "--tree", "{W}/bytes.json"], "tree file {W}/bytes.json is not valid UTF-8 JSON"),
    ("tree file missing", ["generate", "--target", T, "--heads", E, "--prompt", "hi", "--tree", "{W}/nope.json"], "tree file not found: {W}/nope.json"),
    ("empty tree", ["generate", "--target", T, "--heads", E, "--prompt", "hi", "--tree", "[]"], "--tree has no draft node"),
    ("--tree ''", ["generate", "--target", T, "--heads", E, "--prompt", "hi", "--tree", ""], "--tree is empty"),
    ("--heads ''", ["generate", "--target", T, "--prompt", "hi", "--heads", ""], "--heads is empty"),
    ("--heads with --no-heads", ["generate", "--target", T, "--prompt", "hi", "--heads", E, "--no-heads"], "--no-heads decodes without drafts: --heads would be ignored"),
    ("--typical when greedy", ["generate", "--target", T, "--prompt", "hi", "--typical"], "--typical only changes sampling"),
    ("--revision of a local target", ["generate", "--target", T, "--prompt", "hi", "--revision", "v1"], "--revision v1 only applies to Hub ids"),
    ("--tree without heads", ["generate", "--target", T, "--prompt", "hi", "--tree", "chain:2"], "--tree chain:2 needs heads"),
    ("--target ''", ["info", "--target", ""], "--target is empty"),
    ("heads given as the target", ["info", "--target", E], "holds draft heads, not a target model"),
    ("recipe not UTF-8", ["train", "--recipe", "{W}/recipe-bytes.yaml"], "recipe {W}/recipe-bytes.yaml is not UTF-8 text"),
    ("recipe is a directory", ["train", "--recipe", "{W}/junk"], "recipe {W}/junk is a directory"),
    ("train optim.lr=nan", ["train", "--recipe", "{RECIPE:{W}/new-run}", "optim.lr=nan"], "'optim.lr' must be a finite number"),
    ("train optim.lr=-1", ["train", "--recipe", "{RECIPE:{W}/new-run}", "optim.lr=-1"], "optim.lr is out of range"),
    ("train the same data twice", ["train", "--recipe", "{RECIPE:{W}/new-run}", "data.path=[a,a]"], "name a more than once"),
    ("train data.holdout=1.5", ["train", "--recipe", "{RECIPE:{W}/new-run}", "data.holdout=1.5"], "data.holdout must be a fraction < 1 or a whole number"),
    ("train --resume, no checkpoint", ["train", "--recipe", "{RECIPE:{W}/new-run}", "--resume"], "--resume: {W}/new-run holds no checkpoint to continue from"),
    ("train missing data", ["train", "--recipe", "{RECIPE:{W}/new-run}"], "distilled data {W}/nodata does not exist"),
    ("accelerate config not YAML", ["train", "--recipe", "{RECIPE:{W}/new-run}", "--dry-run", "--accelerate-config", "{W}/accelerate-bad.yaml"], "accelerate cannot read {W}/accelerate-bad.yaml"),
    ("accelerate config without --dry-run", ["train", "--recipe", "{RECIPE:{W}/new-run}", "--accelerate-config", "{W}/accelerate-bad.yaml"], "--accelerate-config only goes with --dry-run"),
    ("bench two heads one label", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--heads", E, "--heads", E, "--output", "{W}/b"], "--heads gives the label heads-eagle3 twice"),
    ("bench merge over a measured run", ["bench", "--merge", "{W}/bench-done", "--output", "{W}/bench-copy"], "--output {W}/bench-copy holds a measured bench run"),
    ("bench merge of a damaged shard", ["bench", "--merge", "{W}/bench-done", "{W}/bench-bad", "--output", "{W}/m"], "{W}/bench-bad/report.json is damaged"),
    ("bench merge with measuring flags", ["bench", "--merge", "{W}/bench-done", "--limit", "0", "--output", "{W}/m"], "--merge measures nothing: --limit would be ignored"),
    ("bench questions a directory", ["bench", "--target", T, "--questions", "{W}/junk", "--output", "{W}/b"], "questions {W}/junk is a directory"),
    ("distill datafree.temperature=nan", ["distill", "--target", T, "--out", "{W}/d", "datafree.temperature=nan"], "'datafree.temperature' must be a finite number"),
    ("distill dataset engine without replies", ["distill", "--target", T, "--prompts", "{W}/q3.jsonl", "--engine", "dataset", "--out", "{W}/d", "--max-prompt-tokens", "64"], "no record written (no reply in the data: 3)"),
    ("distill data-free prompts all rejected", ["distill", "--target", T, "--out", "{W}/d", "--num", "2", "--max-new-tokens", "4", "--max-prompt-tokens", "200", "datafree.max_attempts=1"], "the target wrote no usable prompt"),
    ("tune empty candidates", ["tune", "--target", T, "--heads", E, "--candidates", ";;;"], "--candidates names no tree"),
    ("export --kind with heads", ["export", E, "--kind", "eagle3", "--format", "eagle", "--output", "{W}/x"], "--kind picks among the shipped heads"),
    ("export shipped kind in a wrong format", ["export", "--kind", "medusa", "--format", "eagle", "--output", "{W}/x"], "medusa heads cannot be written as --format eagle"),
    ("serve --port 70000", ["serve", "--target", T, "--port", "70000"], "--port must be <= 65535"),
    ("serve --max-batch 0", ["serve", "--target", T, "--max-batch", "0"], "--max-batch must be >= 1"),
    ("serve --api-key ''", ["serve", "--target", T, "--api-key", ""], "--api-key is empty"),
    ("serve --stop", ["serve", "--target", T, "--stop", "x"], "--stop is per request in a server"),
    ("serve --grace nan", ["serve", "--target", T, "--grace", "nan"], "--grace must be >= 0"),
    ("serve --max-tokens 0", ["serve", "--target", T, "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    ("serve --max-body-mb 0", ["serve", "--target", T, "--max-body-mb", "0"], "--max-body-mb must be > 0"),
    ("serve a host that is no address", ["serve", "--target", T, "--host", "999.1.1.1"], "--host '999.1.1.1' is not an address this machine can listen on"),
    ("push --dry-run over unrelated files", ["push", E, "--dry-run", "{W}/junk"], "--dry-run {W}/junk is not empty (notes.txt)"),
    ("push without a repo id", ["push", E], "push needs a repo id"),
    ("serve --threads 100000", ["serve", "--target", T, "--threads", "100000"], "--threads must be in 0.."),
    ("push damaged weights", ["push", "{W}/heads-broken-weights", "org/name"], "{W}/heads-broken-weights/model.safetensors is damaged"),
    ("export without --output", ["export", "--format", "eagle"], "the following arguments are required: --output"),
    # reliability round 5 (issue 67): dry runs fail where runs fail; empty options
    ("train dry run, empty data", ["train", "--recipe", "{RECIPE:{W}/new-run}", "--dry-run", "data.path=[]"], "the real run would refuse this recipe: no training data: data.path is empty"),
    ("train dry run, missing data", ["train", "--recipe", "{RECIPE:{W}/new-run}", "--dry-run"], "the real run would refuse this recipe: distilled data {W}/nodata does not exist"),
    ("train dry run into unrelated files", ["train", "--recipe", "{RECIPE:{W}/junk}", "--dry-run"], "output_dir {W}/junk is not empty (notes.txt) and holds no headstart training run"),
    ("train dry run onto a file", ["train", "--recipe", "{RECIPE:{W}/file.txt}", "--dry-run"], "output_dir {W}/file.txt is a file"),
    ("train dry run into .git", ["train", "--recipe", "{RECIPE:{W}/repo/.git/out}", "--dry-run"], "is inside a git repository's .git folder"),
    ("bench --merge into a look-alike", ["bench", "--merge", "{W}/bench-done", "--output", "{W}/lookalike"], "--output {W}/lookalike is not empty"),
    ("bench into a look-alike", ["bench", "--target", T, "--questions", "{W}/q3.jsonl", "--output", "{W}/lookalike"], "--output {W}/lookalike is not empty"),
    ("lookahead empty option", ["generate", "--target", T, "--draft-model", "lookahead:window=4,,ngram=3", "--prompt", "hi"], "'lookahead:window=4,,ngram=3' has an empty option"),
    ("lookahead option twice", ["generate", "--target", T, "--draft-model", "lookahead:window=4,window=3", "--prompt", "hi"], "gives window twice"),
    ("dynamic tree empty option", ["generate", "--target", T, "--heads", E, "--prompt", "hi", "--tree", "dynamic:depth=3,,top_k=2"], "'dynamic:depth=3,,top_k=2' has an empty option"),
    ("dynamic tree trailing comma", ["generate", "--target", T, "--heads", E, "--prompt", "hi", "--tree", "dynamic:depth=3,"], "has an empty option"),
]  # fmt: skip


def _fill(arg: str, w: Path, target: Path) -> str:
    if arg.startswith("{RECIPE:"):
        return _recipe(w, target, arg.removeprefix("{RECIPE:").removesuffix("}").replace("{W}", str(w)))
    return arg.replace("{W}", str(w)).replace("{T}", str(target))


def snapshot(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every entry under root (hidden ones included): a file's size and modification time; a
    directory's existence (its time moves when a writability probe makes and removes a temp dir)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
    }


@pytest.mark.parametrize("name, argv, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, argv, message, work, tiny_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(work / "cwd")
    args = [_fill(a, work, tiny_llama) for a in argv]
    before = snapshot(work)
    capsys.readouterr()  # what fixtures printed while loading is not this command's
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err
    # a command that failed after its work began may have drawn a progress bar (its own lines)
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("error: ") and " -- fix: " in lines[0], lines[0]
    assert _fill(message, work, tiny_llama) in lines[0]
    assert snapshot(work) == before  # nothing written, nothing lost: no dir, lock or temp file left


def test_real_process_sample(work, tiny_llama, tmp_path):
    """The same contract through a real process: raw non-UTF-8 bytes in argv, argparse errors."""
    env = dict(os.environ, HEADSTART_CACHE=str(tmp_path / "cache"))
    runs = [
        ([b"generate", b"--target", str(tiny_llama).encode(), b"--prompt", b"\xff\xfehello"], "not valid UTF-8"),
        ([b"export", b"--format", b"eagle", b"--output", str(work / "run").encode(), str(work / "run" / "final").encode(),
          b"--target", str(tiny_llama).encode()], "holds the input"),
        ([b"bench", b"--limit", b"x", b"--output", b"o"], "argument --limit: invalid int value"),
    ]  # fmt: skip
    for argv, message in runs:
        proc = subprocess.run([sys.executable.encode(), b"-m", b"headstart", *argv], capture_output=True, env=env,
                              cwd=work / "cwd", timeout=300)  # fmt: skip
        err = proc.stderr.decode(errors="replace")
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], err
    assert (work / "run" / "final" / "config.json").is_file() and (work / "run" / "results.json").is_file()


def test_chat_reports_a_bad_message_and_goes_on(work, tiny_llama, capsys, monkeypatch):
    """One over-long message and one that is not UTF-8 each cost that turn, not the session."""
    lines = b"hello\n" + b"word " * 700 + b"\n\xff\xfe\nagain\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines), encoding="utf-8"))
    seen = []
    import headstart.commands.chat as chat

    real = chat.turn

    def spy(target, decoding, messages, text):
        seen.append([m["content"] for m in messages])
        return real(target, decoding, messages, text)

    monkeypatch.setattr(chat, "turn", spy)
    capsys.readouterr()
    code = main(["chat", "--target", str(tiny_llama), "--max-new-tokens", "4", "--no-heads"])
    err = capsys.readouterr().err
    assert code == 0
    assert "exceeds the target's context" in err and "the message is not valid UTF-8" in err
    assert err.count("message dropped; the conversation goes on") == 2
    assert len(seen) == 4 and seen[3][0] == "hello" and len(seen[3]) == 2  # the 4th turn follows the 1st


def test_generate_json_gives_each_prompt_its_own_figures(work, tiny_llama, capsys):
    """Two prompts of one batch that stop at different lengths: each object's stats are its own,
    and the batch's figures are labelled as such."""
    base = ["generate", "--target", str(tiny_llama), "--heads", str(work / "heads-eagle3"), "--speculate", "always",
            "--json", "--raw"]  # fmt: skip
    capsys.readouterr()
    assert main([*base, "--prompt", "abc", "--max-new-tokens", "12"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    stop = text[2:4]  # stops the first prompt after a few tokens
    assert main([*base, "--prompt", "abc", "--prompt", "xyz", "--max-new-tokens", "12", "--stop", stop]) == 0
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    for item in (first, second):
        assert item["stats"]["new_tokens"] == len(item["token_ids"])
        assert item["stats"]["batch"]["batch_size"] == 2
    assert first["stats"]["new_tokens"] < 12 or second["stats"]["new_tokens"] < 12
    assert first["stats"]["batch"]["new_tokens"] == len(first["token_ids"]) + len(second["token_ids"])


def test_bench_resume_of_a_finished_run_measures_nothing(work, tiny_llama, capsys):
    report = (work / "bench-done" / "report.json").read_bytes()
    args = ["bench", "--target", str(tiny_llama), "--heads", str(work / "heads-eagle3"), "--questions",
            str(work / "q3.jsonl"), "--baselines", "vanilla", "--max-new-tokens", "4", "--resume",
            "--output", str(work / "bench-done")]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "nothing to resume" in captured.err and "headstart bench" in captured.out
    assert (work / "bench-done" / "report.json").read_bytes() == report


def test_a_damaged_tuned_tree_is_said_and_ignored(work, tiny_llama, tmp_path, capsys):
    """tuned_tree.json is an optimisation: damaged, it is named in a warning, and decoding goes on."""
    heads = tmp_path / "heads"
    shutil.copytree(work / "heads-eagle3", heads)
    base = [
        "generate",
        "--target",
        str(tiny_llama),
        "--heads",
        str(heads),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "4",
    ]
    for content in (b"{bad", b"[1, 2]", b'{"tree": "foo"}', b"\xff\xfe", b'{"tree": null}', b'{"tree": 5}',
                    b'{"tree": "chain:1", "threads": "two"}', b'{"tree": "chain:1", "over_plain": {"speedup": "fast"}}',
                    b'{"tree": "[[9],[9,9]]"}'):  # fmt: skip
        (heads / "tuned_tree.json").write_bytes(content)
        capsys.readouterr()
        assert main(base) == 0
        err = capsys.readouterr().err
        assert "tuned_tree.json is damaged" in err or "is not a tree" in err, err


def test_push_takes_an_export(work, tiny_llama, tmp_path, monkeypatch, capsys):
    """An engine-format export (what vLLM serves) is pushed with its own files."""
    import huggingface_hub

    import headstart.targets.hub as hub

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)  # the fake client below is the Hub
    out = tmp_path / "spec"
    assert main(["export", str(work / "heads-eagle3"), "--target", str(tiny_llama), "--format", "speculators",
                 "--output", str(out)]) == 0  # fmt: skip
    sent = {}

    class Api:
        def __init__(self, token=None):
            pass

        def create_repo(self, *args, **kwargs):
            pass

        def hf_hub_download(self, **kwargs):
            from huggingface_hub.errors import EntryNotFoundError

            raise EntryNotFoundError("no earlier push")

        def upload_folder(self, **kwargs):
            sent.update(kwargs)
            return "https://hub/commit"

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    assert main(["push", str(out), "org/name"]) == 0
    assert sent["allow_patterns"] == ["README.md", "config.json", "model.safetensors", ".headstart-push.json"]
    assert "pushed speculators export of heads" in capsys.readouterr().out


def test_distill_keeps_finished_records_on_sigterm(tiny_llama, tmp_path):
    """SIGTERM (a scheduler, `timeout`) ends distill as Ctrl-C does: the records finished so far
    are published, one line says so, exit 130; the same command then completes the set."""
    import signal
    import time

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i} please"}) + "\n" for i in range(400)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "headstart", "distill", "--target", str(tiny_llama), "--prompts", str(prompts),
           "--out", str(out), "--num", "400", "--max-new-tokens", "48", "--batch-size", "4", "--shard-size",
           "1000", "--threads", "1", "--max-prompt-tokens", "64"]  # fmt: skip
    env = dict(os.environ, HEADSTART_CACHE=str(tmp_path / "cache"))
    import threading

    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env)
    chunks: list[bytes] = []  # stderr as it comes: the progress bar says when records are done
    reader = threading.Thread(
        target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(4096), b"")), daemon=True
    )
    reader.start()
    deadline = time.time() + 300
    # some records finish (a bar at 1/400 or more), none is a whole shard (shard size 1000): on a
    # loaded machine a fixed wait could end before the first record
    while (
        time.time() < deadline
        and proc.poll() is None
        and not re.search(rb"\| *[1-9]\d*/400 ", b"".join(chunks))
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = b"".join(chunks).decode()
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.search(line)
             and not line.startswith("note: other processes keep")]  # a busy machine's information line  # fmt: skip
    assert proc.returncode == 130, err
    assert len(lines) == 1 and "distill interrupted:" in lines[0] and "rerun the same command" in lines[0], (
        err
    )
    kept = int(lines[0].split("distill interrupted: ")[1].split()[0])
    records = [
        line for path in (out / "data").glob("shard-*.jsonl") for line in path.read_text().splitlines()
    ]
    assert kept == len(records) > 0
