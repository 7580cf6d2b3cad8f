"""A trainable draft model: a small causal LM of the target's own architecture, started as the
target's first `head.num_layers` decoder layers with its embeddings, final norm and lm_head (a
truncated copy, untied), then trained on the target's outputs (train/objectives/draft.py: KL to
the target's next-token distribution). It drafts as a draft model does (`--draft-model`,
inference/drafters/draft_model.py): tokens in, its own KV cache, no target features.

Where a smaller sibling of the target exists (Llama-3.2-1B for Llama-3.1-8B), pass it as
`--draft-model` untrained; this kind is the draft for targets that have none (the embedded
SmolLM2), and the way to fine-tune a draft on the target's own outputs (DistillSpec)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.checkpoint import HeadCheckpoint
from headstart.heads.config import SHAPE, HeadConfig
from headstart.heads.vocab import DraftVocab


@dataclass
class DraftOptions:
    """A draft model's own `head.*` keys (HeadSpec.options for head.kind=draft_model)."""

    lora_rank: int = 0
    """Train LoRA adapters of this rank (peft) on the draft's linear layers instead of every weight
    (0: full fine-tuning, the default); the saved head holds the merged weights, so it loads and
    exports as a fully trained one."""
    draft_from: str | None = None
    """Start from this causal LM (a Hub id or directory sharing the target's tokenizer: a smaller
    sibling, Llama-3.2-1B for Llama-3.1-8B) instead of the target's first `num_layers` layers; its
    own architecture and depth, its lm_head trained untied."""

    def __post_init__(self) -> None:
        if not 0 <= self.lora_rank <= 1024:
            raise HeadstartError(
                f"head.lora_rank must be in 0..1024, got {self.lora_rank}", "use e.g. head.lora_rank=16"
            )


@dataclass
class DraftModelConfig:
    """A draft model's own fields of a checkpoint's config.json (HeadConfig.options for kind
    draft_model)."""

    draft_from: str = ""
    """The model the draft started from (DraftOptions.draft_from; "" for the target's own first
    layers). Read once, when the head is built; kept as its provenance."""
    draft_config: dict[str, Any] = field(default_factory=dict, metadata=SHAPE)
    """The draft model's transformers config (empty: the target's, cut to num_layers)."""

    def portable(self) -> DraftModelConfig:
        """A sibling loaded from a local folder is named by that folder's name, as the target."""
        if self.draft_from and Path(self.draft_from).expanduser().exists():
            return replace(self, draft_from=Path(self.draft_from).name)
        return self


class DraftLM(DraftVocab, HeadCheckpoint, nn.Module):
    """The draft causal LM (`self.model`, a transformers model of the target's architecture with
    `num_layers` layers); `forward(input_ids)` gives its final hidden states, `logits` its
    next-token logits over the target vocabulary."""

    kind = "draft_model"
    feature_layers: tuple[int, ...] = ()
    options = ("num_layers", "draft_from", "lora_rank")
    pack_model = None  # its own packer (inference/drafters/draft_model.py)

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        """head.num_layers: the target's first layers the draft starts from (fewer: cheaper drafts);
        head.draft_from: a sibling model to start from instead (its config, checked against the
        target's vocabulary here; its weights read when the head is built)."""
        from headstart.errors import HeadstartError

        if spec.draft_from is not None:
            if spec.num_layers not in (None, 1):
                raise HeadstartError(
                    "head.num_layers and head.draft_from both set: a sibling brings its own depth",
                    "drop head.num_layers (or head.draft_from, to cut the target instead)",
                )
            return _sibling_fields(str(spec.draft_from), target)
        layers = int(spec.num_layers or 1)
        if layers >= target.num_layers:
            raise HeadstartError(
                f"head.num_layers={layers}: a draft model needs fewer layers than the target's {target.num_layers}",
                f"set head.num_layers between 1 and {target.num_layers - 1} (e.g. {max(1, target.num_layers // 4)})",
            )
        return {"num_layers": layers, "draft_config": _draft_config(target.model.config.to_dict(), layers)}

    def __init__(self, config: HeadConfig) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        super().__init__()
        self.config = config
        settings = dict(config.draft_config or _draft_config(config.target_config, config.num_layers))
        draft_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
        self.model = AutoModelForCausalLM.from_config(draft_config)
        self.init_draft_vocab(config.vocab_size, config.vocab_size, always=False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def describe(self) -> str:
        start = f", started from {self.config.draft_from}" if self.config.draft_from else ""
        return f"a trained draft model ({self.config.num_layers} layers{start})"

    def bind(self, target_model: Any) -> None:
        """Nothing to attach: the draft owns all its modules."""

    def init_from_target(self, target_model: Any) -> None:
        """Start as the target cut to its first layers: every tensor of the draft copied from the
        target's tensor of the same name (the lm_head from the embeddings where the target ties
        them); or, with `draft_from`, as that sibling model (the same by its own tensors)."""
        source = target_model
        if self.config.draft_from:
            from transformers import AutoModelForCausalLM

            source = AutoModelForCausalLM.from_pretrained(self.config.draft_from, dtype=self.dtype)
        theirs = source.state_dict()
        embed = source.get_input_embeddings().weight
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                source = theirs.get(name)
                if source is None and name.endswith("lm_head.weight"):
                    source = embed
                if source is None or source.shape != tensor.shape:
                    where = self.config.draft_from or "the target"
                    raise ValueError(f"{where} has no tensor {name} of shape {tuple(tensor.shape)}")
                tensor.copy_(source)

    def before_training(self, spec: Any) -> None:
        """The trainer's call before the first step: LoRA adapters instead of every weight when
        the recipe asks (head.lora_rank)."""
        if spec.lora_rank:
            self.train_lora(spec.lora_rank)

    def train_lora(self, rank: int) -> None:
        """Train LoRA adapters of `rank` on every linear layer of the draft's decoder (peft; its
        lm_head and embeddings stay as they are) instead of every weight: the base weights frozen,
        the adapters trainable. Saving merges them (`_save_pretrained`)."""
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise HeadstartError(
                "head.lora_rank needs peft, which is not installed", "pip install 'headstart[lora]'"
            )
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear")
        self.model = get_peft_model(self.model, lora)

    def _save_pretrained(self, save_directory: Any) -> None:
        """The checkpoint holds plain weights: LoRA adapters (while training with them) are merged
        into a copy, under the names a model without them has."""
        from headstart.heads.checkpoint import write_checkpoint

        write_checkpoint(save_directory, self.config, self.plain_state())

    def plain_state(self) -> dict[str, torch.Tensor]:
        """The state dict as an unwrapped draft's: with LoRA adapters, their merge (W + B A s)."""
        if not hasattr(self.model, "merge_adapter"):
            return self.state_dict()
        self.model.merge_adapter()
        try:
            state = {
                key.replace("model.base_model.model.", "model.", 1).replace(
                    ".base_layer.", "."
                ): value.detach().clone()
                for key, value in self.state_dict().items()
                if "lora_" not in key
            }
        finally:
            self.model.unmerge_adapter()
        return state

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> final hidden states (B, T, H), the lm_head's input."""
        out = self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)


def check_vocabulary(draft_tokenizer: Any, target_tokenizer: Any, spec: str) -> None:
    """One line when the draft's tokens are not the target's (a drafted id would mean another text)."""
    mine, theirs = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if mine == theirs:
        return
    differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda item: item[1])
    token, index = differ[0]
    where = f"'{token}' is id {index} in {'the draft' if mine.get(token) == index else 'the target'}"
    raise HeadstartError(
        f"the draft model {spec} has another vocabulary than the target ({len(mine)} tokens against "
        f"{len(theirs)}; {where}, not in the other)",
        "pick a draft of the target's family (the same tokenizer), or the target's own layers (early-exit:K, head.num_layers)",
    )


def _sibling_fields(name: str, target: Any) -> dict[str, Any]:
    """The HeadConfig fields of a draft that starts as the model `name` (a directory or Hub id):
    its config (lm_head untied), refused in one line when its tokenizer or its vocabulary size is
    not the target's, or when it is not smaller than the target."""
    from transformers import AutoConfig, AutoTokenizer

    from headstart.errors import HeadstartError

    try:
        config = AutoConfig.from_pretrained(name)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise HeadstartError(f"head.draft_from: cannot read a model at {name} ({err})".splitlines()[0],
                             "pass a local model directory or a Hub id (with its tokenizer)") from None  # fmt: skip
    settings = config.to_dict()
    check_draft_pair(name, tokenizer, settings, target, "head.draft_from")
    layers = int(settings.get("num_hidden_layers") or 0)
    if Path(name).expanduser().exists():  # a local folder: by its absolute path (a resume may run elsewhere)
        name = str(Path(name).expanduser().resolve())
    return {"num_layers": layers, "draft_config": _draft_config(settings, layers), "draft_from": name}


def check_draft_pair(name: str, tokenizer: Any, settings: dict[str, Any], target: Any, flag: str) -> None:
    """The checks a draft model passes before it drafts or trains, each refused in one line naming
    `flag` (head.draft_from, --draft-model): the target's tokenizer (the same ids for the same
    text), its output rows (a drafted id past the target's rows would index out of range), at least
    one layer, and fewer parameters than the target (`_size`; --draft-model may allow a larger
    one: its caller checks the real count)."""
    check_vocabulary(tokenizer, target.tokenizer, name)
    rows = settings.get("vocab_size")
    if rows != target.vocab_size:
        raise HeadstartError(
            f"{flag}: {name} has {rows} output rows, the target {target.vocab_size}",
            "use a model with the target's vocabulary (its smaller sibling), or the target's own layers "
            "(early-exit:K, head.num_layers)",
        )
    if not int(settings.get("num_hidden_layers") or 0) >= 1:
        raise HeadstartError(f"{flag}: {name} has no decoder layers", "use a model with at least one layer")
    theirs = target.model.config.to_dict()
    if flag == "head.draft_from" and _size(settings) >= _size(theirs):
        raise HeadstartError(
            f"{flag}: {name} is not smaller than the target (~{_size(settings) / 1e6:.0f}M against "
            f"~{_size(theirs) / 1e6:.0f}M parameters)",
            "start from a smaller sibling, or use head.num_layers (the target's first layers)",
        )


def _size(config: dict[str, Any]) -> float:
    """A transformers config's parameter count, roughly: its layers' attention and MLP matrices
    (4 H^2 + 3 H I each) and its embeddings; enough to tell a smaller sibling from a larger model."""
    hidden, layers = config.get("hidden_size") or 0, config.get("num_hidden_layers") or 0
    inner = config.get("intermediate_size") or 4 * hidden
    return layers * (4 * hidden * hidden + 3 * hidden * inner) + (config.get("vocab_size") or 0) * hidden


def _draft_config(target_config: dict[str, Any], layers: int) -> dict[str, Any]:
    """The target's transformers config cut to `layers` layers (per-layer lists too), its lm_head
    untied (the draft trains its own), its local paths dropped."""
    config = dict(target_config)
    config["num_hidden_layers"] = layers
    for name in ("layer_types", "no_rope_layers"):
        if isinstance(config.get(name), list):
            config[name] = config[name][:layers]
    config["tie_word_embeddings"] = False
    for key in ("_name_or_path", "_model_name_or_path", "_commit_hash", "architectures", "transformers_version",
                "id2label", "label2id"):  # fmt: skip
        config.pop(key, None)
    # as config.json will hold it (JSON keys are strings): a resume or warm start compares the two
    return json.loads(json.dumps(config))
