"""Heads in the serving engines' formats, both ways, one adapter module per format (as
speculators registers one class per model type):

- `speculators`: vLLM's `speculators` format (config.json with `speculators_model_type` and a
  `transformer_layer_config`). vLLM serves the directory as it is.
- `eagle`: the EAGLE-3 release's layout (`midlayer.*`, a LlamaForCausalLMEagle3 config.json), which
  SGLang, SpecForge, the EAGLE repo and llama.cpp's converter read.
- `medusa`: vLLM's Medusa layout (and, on import, the Medusa repo's `medusa_lm_head.*`).
- `dflash`: z-lab's DFlash layout (`DFlashDraftModel` with a `dflash_config`), which llama.cpp's
  converter (`--spec-type draft-dflash`) and SGLang read; speculators' own DFlash layout is
  `speculators`.
- `headstart`: headstart's own checkpoint at another dtype (how the shipped heads become bf16).
- `transformers`: a trained draft model as a plain model directory with the target's tokenizer
  (what `--draft-model` and other engines' draft-model speculation load; not read back as heads).

An adapter module holds `FILES` (what its export writes), `detects(config) -> bool`,
`export(head, verifier, dtype) -> write(directory)` (refusing, in one line, what the format
cannot hold, before anything is written) and `load(directory, config, target) -> head` (checked
against the target). A new format is one
module and one line in ADAPTERS. Conventions: d2t holds offsets (target id = i + d2t[i]), t2d is a
bool mask over the target vocabulary; aux-layer ids follow the engines (id i = the input of
decoder layer i), i.e. headstart's feature layer id + 1.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from headstart.errors import HeadstartError
from headstart.heads.files import TUNED_FILE, read_json
from headstart.heads.formats.common import mismatch, torch_dtype, writer

__all__ = [
    "FORMATS",
    "adapter",
    "detect_format",
    "export_heads",
    "mismatch",
    "read_foreign",
    "torch_dtype",
    "writer",
]

ADAPTERS = {
    "headstart": "headstart.heads.formats.own",
    "speculators": "headstart.heads.formats.speculators",
    "medusa": "headstart.heads.formats.medusa",
    "dflash": "headstart.heads.formats.zlab",
    "eagle": "headstart.heads.formats.eagle",
    "transformers": "headstart.heads.formats.transformers",  # last: it detects any causal LM's config
}
"""Format name -> adapter module, in the order `detect_format` asks them."""
FORMATS = tuple(ADAPTERS)


def adapter(fmt: str) -> ModuleType:
    if fmt not in ADAPTERS:
        raise HeadstartError(f"unknown head format '{fmt}'", f"use one of {', '.join(ADAPTERS)}")
    return importlib.import_module(ADAPTERS[fmt])


EXPORT_MARK = ".headstart-export"
"""Written into every export (JSON: the format and the files it wrote): only a directory holding it
is an earlier export that a new one may write into without --overwrite (a training run's `final/`
has the same file names), and only the files it lists may be removed by a later export."""
CARD_FILE = "README.md"


def export_heads(
    head: Any, fmt: str, output: str | Path, *, dtype: str = "bfloat16", verifier: str | None = None,
    tuned: dict[str, Any] | None = None, tokenizer: Any = None,
) -> Path:  # fmt: skip
    """Write `head` in format `fmt` into the directory `output`, with its model card and the tree
    `headstart tune` stored for the heads (`tuned`) when given: the same heads at another dtype or
    layout decode with the same tree. Every file lands whole or not at all; an earlier export's
    files that this one does not write are removed, nothing else (headstart.outputs). Refuses
    what the format cannot express, before anything is written. `tokenizer`: the target's, saved
    beside a format that is a whole model (`WITH_TOKENIZER`: transformers)."""
    import copy

    from headstart.heads.checkpoint import model_card
    from headstart.outputs import files_under, publish_dir, refuse_protected

    refuse_protected(output, "the export's output")
    torch_dtype(dtype)
    verifier = verifier or default_verifier(head.config)
    head = copy.copy(head)  # the same parameters under a config without this machine's paths
    head.config = head.config.portable()
    write = adapter(fmt).export(head, verifier, dtype)
    with_tokenizer = getattr(adapter(fmt), "WITH_TOKENIZER", False)
    if with_tokenizer and tokenizer is None:
        raise HeadstartError(
            f"--format {fmt} writes a whole model: it needs the target's tokenizer", "pass tokenizer="
        )

    def publish(tmp: Path) -> None:
        write(tmp)
        if with_tokenizer:
            tokenizer.save_pretrained(tmp)
        if not (tmp / CARD_FILE).exists():
            model_card(head.config, fmt=fmt, base_model=verifier).save(tmp / CARD_FILE)
        if tuned is not None:
            (tmp / TUNED_FILE).write_text(json.dumps(tuned, indent=1) + "\n")
        files = [*files_under(tmp), EXPORT_MARK]
        (tmp / EXPORT_MARK).write_text(json.dumps({"format": fmt, "files": files}) + "\n")

    return publish_dir(output, publish, stale=export_files(Path(output).expanduser()))


def export_files(path: Path) -> list[str]:
    """The files an earlier `headstart export` wrote into `path` (its mark's list; an export made
    before the mark listed them: its format's files), [] when `path` holds no export."""
    mark = path / EXPORT_MARK
    if not mark.is_file():
        return []
    try:
        recorded = json.loads(mark.read_text())
        files = recorded.get("files")
        if isinstance(files, list) and all(isinstance(f, str) for f in files):
            return files  # publish_dir removes only plain relative names inside the directory
        return sorted(adapter(recorded["format"]).FILES | {TUNED_FILE, EXPORT_MARK})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, HeadstartError):
        return []  # a damaged mark proves nothing: remove nothing


def is_export(path: Path, fmt: str) -> bool:
    """`path` is an earlier `headstart export --format fmt` (its mark says so and its config.json
    is that format's)."""
    try:
        if json.loads((Path(path) / EXPORT_MARK).read_text()).get("format") != fmt:
            return False
        return detect_format(path) == fmt
    except (OSError, ValueError, AttributeError, HeadstartError):
        return False


def detect_format(path: str | Path) -> str:
    """The format of a head directory, from its config.json."""
    config = read_json(Path(path) / "config.json")
    for fmt in ADAPTERS:
        if adapter(fmt).detects(config):
            return fmt
    if "speculators_model_type" in config:
        raise HeadstartError(
            f"{path} is a speculators '{config['speculators_model_type']}' head",
            "headstart reads speculators eagle3 and dflash heads; convert or retrain",
        )
    raise HeadstartError(
        f"{path}/config.json is not a head checkpoint headstart knows",
        "pass a headstart, speculators (eagle3, dflash), EAGLE-3 (LlamaForCausalLMEagle3), DFlash "
        "(DFlashDraftModel) or Medusa head directory",
    )


def read_foreign(path: str | Path, fmt: str, target: Any) -> Any:
    """A published head (format `fmt`) as a headstart head for `target`: checked against the
    target's shapes (one line naming the mismatch), bound, on its device."""
    directory = Path(path)
    config = read_json(directory / "config.json")
    try:
        head = adapter(fmt).load(directory, config, target)
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a field of the wrong shape
        raise HeadstartError(
            f"{directory}/config.json is not a valid {fmt} head config ({type(err).__name__}: {err})",
            "restore or re-download the checkpoint",
        ) from None
    head.to(target.device)
    head.bind(target.model)
    return head


def default_verifier(config: Any) -> str:
    """The target as a serving engine names it: its Hub id (the embedded GGUF is a Q4_1
    quantisation of SmolLM2-135M-Instruct: served with the original weights), else the name of
    its local folder or file (never the machine's path: pass --verifier to name its Hub id)."""
    from headstart.targets.gguf import hub_id

    return hub_id(config.target) or Path(str(config.target.get("name"))).name
