"""TrainConfig: everything a training recipe (recipes/*.yaml) can set, with a docstring per field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from headstart.config import section
from headstart.errors import HeadstartError
from headstart.heads.config import HeadSpec


@dataclass
class DataConfig:
    path: list[str] = field(default_factory=list)
    """Directories written by `headstart distill` (one, or a list whose conversations are joined;
    every fingerprint must match the target)."""
    mode: Literal["online", "offline"] = "online"
    """online: the frozen target runs inside the loop; offline: read features cached by distill."""
    max_length: int = 1024
    """Truncate conversations to this many tokens."""
    eval_path: list[str] = field(default_factory=list)
    """Directories used only for held-out metrics, never trained on: a fixed evaluation set that
    stays the same when `path` grows (continuing a run with init_from on more data)."""
    holdout: float | None = None
    """Held-out share of `path` for metrics: a fraction (< 1) or a number of conversations (>= 1);
    default 0.05 without eval_path, 0 with it."""
    max_records: int = 0
    """Use only N conversations of `path` (0 = all); `max_records_from` says which."""
    max_records_from: Literal["first", "each"] = "first"
    """first: the first N of `path` joined in order; each: the same share of every directory (the
    first N * len(dir) / total of each), so sizes keep the mix of sources and nest (a data-scaling
    curve)."""
    shares: list[float] = field(default_factory=list)
    """With max_records: the share of the N conversations each directory of `path` gives (one
    number per directory, in order, summing to 1; its first conversations), instead of what
    max_records_from says: a data mix (chat, math, data-free) at a fixed size. Empty: none."""
    group_by_length: int = 64
    """Batch conversations of similar length: each epoch's shuffled order is cut into groups of
    this many batches, sorted by length inside a group, and the batches shuffled again (padding to
    the longest of a random batch wastes ~40% of a step on distilled chat data). 0 = plain shuffle."""
    pack: int = 0
    """Training rows of this many positions, each packed with whole conversations (first-fit
    decreasing by length, once; the rows shuffled every epoch): `batch_size` then counts rows.
    Each conversation keeps its own positions (from 0) and sees only itself, in the target (a
    block-causal mask) and in the head. Held-out metrics stay one conversation a row. Needs
    max_length <= pack and a kind whose objective packs (EAGLE-3). 0 = one conversation a row."""

    def __post_init__(self) -> None:
        # A YAML `null` (or an override `data.eval_path=null`) means none, like an empty list.
        self.path = [self.path] if isinstance(self.path, str) else list(self.path or [])
        self.eval_path = [self.eval_path] if isinstance(self.eval_path, str) else list(self.eval_path or [])
        if self.holdout is None:
            self.holdout = 0.0 if self.eval_path else 0.05
        if self.group_by_length < 0:
            raise HeadstartError(
                f"data.group_by_length must be >= 0, got {self.group_by_length}",
                "set data.group_by_length=64",
            )
        if self.max_length < 8:
            raise HeadstartError(
                f"data.max_length must be >= 8, got {self.max_length}", "set data.max_length=1024"
            )
        if self.pack < 0 or (self.pack and self.pack < self.max_length):
            raise HeadstartError(
                f"data.pack={self.pack} is shorter than data.max_length={self.max_length}: a conversation "
                "would not fit in a row",
                f"set data.pack={max(self.max_length, 2048)} (or data.pack=0: one conversation a row)",
            )
        if self.holdout < 0 or (self.holdout >= 1 and self.holdout != int(self.holdout)):
            raise HeadstartError(
                f"data.holdout must be a fraction < 1 or a whole number of conversations, got {self.holdout}",
                "set data.holdout=0.05 (5%) or data.holdout=96 (96 conversations)",
            )
        # the same directory however spelt (trailing slash, relative, a symlink): trained on and
        # held out at once, every held-out figure would be inflated
        named = [str(Path(p).resolve()) for p in self.path + self.eval_path]
        repeated = sorted(
            {p for p, real in zip(self.path + self.eval_path, named, strict=True) if named.count(real) > 1}
        )
        if repeated:
            raise HeadstartError(
                f"data.path/data.eval_path name {', '.join(repeated)} more than once: its conversations would "
                "count twice (or be trained on and held out)",
                "name each distilled directory once",
            )
        if self.max_records < 0:
            raise HeadstartError(
                f"data.max_records must be >= 0, got {self.max_records}", "set data.max_records=0 (all)"
            )
        if self.shares and (
            len(self.shares) != len(self.path)
            or any(x < 0 for x in self.shares)
            or abs(sum(self.shares) - 1) > 1e-6
            or not self.max_records
        ):
            raise HeadstartError(
                f"data.shares must give one share >= 0 per data.path directory ({len(self.path)}), summing "
                f"to 1, with data.max_records set; got {self.shares}",
                "e.g. data.path=[A,B] data.shares=[0.5,0.5] data.max_records=1000",
            )
        if self.max_records_from not in ("first", "each"):
            raise HeadstartError(
                f"data.max_records_from must be first or each, got {self.max_records_from!r}",
                "set data.max_records_from=first",
            )


@dataclass
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"
    """adamw for every parameter; muon: torch.optim.Muon on the hidden layers' 2-D weights and AdamW
    on the rest (lm_head, embeddings, norms, biases), as speculators and Muon's authors split them
    (headstart/train/optimizers.py)."""
    lr: float = 1e-3
    """Peak learning rate (AdamW's; Muon's too, scaled to AdamW's update size, unless muon_lr)."""
    muon_lr: float | None = None
    """optim.name=muon: Muon's own peak rate (still scaled to AdamW's update size); None = lr."""
    momentum: float = 0.95
    """optim.name=muon: Muon's (Nesterov) momentum."""
    weight_decay: float = 0.0
    """Weight decay (decoupled; both optimizers)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up of the learning rate over this many optimizer steps."""
    schedule: Literal["constant", "cosine", "linear", "wsd"] = "cosine"
    """Learning-rate decay after warm-up (to 0 at max_steps for cosine/linear); wsd
    (warmup-stable-decay): the peak rate, then a linear decay to 0 over the last `decay` of the run,
    a schedule a run can be extended under (headstart/train/schedule.py)."""
    decay: float = 0.2
    """wsd: the share of the run that decays: of max_steps, or under time_budget_s, of the budget's
    training time (the decay's steps then sized by the measured pace when it starts)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm (0 = no clipping)."""
    freeze: list[str] = field(default_factory=list)
    """Head parameters that keep their initial values: names or name prefixes of the head's
    state dict, e.g. [lm_head] keeps EAGLE-3's draft lm_head at the target's rows (and skips its
    weight gradient, the largest matrix multiply of a step). Empty: everything trains."""

    def __post_init__(self) -> None:
        checks = {
            "optim.lr": (self.lr >= 0, "set optim.lr=1e-3"),  # 0: evaluate and re-save (init_from)
            "optim.weight_decay": (self.weight_decay >= 0, "set optim.weight_decay=0"),
            "optim.warmup_steps": (self.warmup_steps >= 0, "set optim.warmup_steps=0"),
            "optim.decay": (0 <= self.decay <= 1, "set optim.decay=0.2 (the last 20% of the run decays)"),
            "optim.muon_lr": (self.muon_lr is None or self.muon_lr >= 0, "set optim.muon_lr=null (= optim.lr)"),
            "optim.momentum": (0 <= self.momentum < 1, "set optim.momentum=0.95"),
            "optim.max_grad_norm": (self.max_grad_norm >= 0, "set optim.max_grad_norm=1.0 (0 = no clipping)"),
            "optim.betas": (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "set optim.betas=[0.9,0.95]"),
        }  # fmt: skip
        for name, (ok, fix) in checks.items():
            if not ok:
                raise HeadstartError(f"{name} is out of range: {getattr(self, name.split('.')[1])}", fix)


@dataclass
class LoraConfig:
    enabled: bool = False
    """Medusa-2: train the target jointly through LoRA adapters (the decoded text then follows the
    adapted target, not the original one)."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA alpha."""
    dropout: float = 0.0
    """LoRA dropout."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names of the target to adapt."""
    lm_weight: float = 1.0
    """Weight of the target's own next-token loss; the heads' loss is scaled by heads_weight."""
    heads_weight: float = 0.2
    """Weight of the summed Medusa losses in the joint loss (the Medusa-2 paper's 0.2)."""
    warmup_steps: int = 0
    """Train the heads alone (target frozen) for this many optimizer steps first."""


@dataclass
class TrainConfig:
    target: str = "smollm2"
    """The frozen target: Hub id, local directory, .gguf or 'smollm2'."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Target (and head) weights dtype."""
    output_dir: str = "runs/heads"
    """Where checkpoints, logs and the final head (output_dir/final) go."""
    head: HeadSpec = field(default_factory=HeadSpec)
    """The head to train (headstart.heads.HeadSpec)."""
    init_from: str | None = None
    """Start from these heads' weights (a directory saved by headstart, e.g. an earlier run's
    output_dir/final or a shipped default) instead of a fresh initialisation: fine-tune on new data
    or train longer. The heads must match `head` and the target; EAGLE-3 keeps their draft vocabulary."""
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: Any = field(default_factory=dict)
    """The `loss.*` keys of the head's kind, read into its section (HeadKind.loss_section, e.g.
    headstart.train.objectives.medusa.MedusaLoss; None for a kind with none): `cfg.loss.KEY`."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    batch_size: int = 4
    """Conversations per process per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (global batch = batch_size * grad_accum * processes)."""
    max_steps: int = 1000
    """Optimizer steps to train (0 with init_from: evaluate and re-save the saved heads, e.g. with
    a Medusa draft vocabulary added)."""
    seed: int = 0
    """Seeds data order, initialisation and noise."""
    topk: int = 5
    """Held-out metrics report top-1 and top-`topk` accuracy."""
    eval_every: int = 200
    """Evaluate on the held-out split every N steps (and at the end)."""
    eval_batches: int = 0
    """Limit each evaluation to N batches (0 = the whole held-out split)."""
    log_every: int = 10
    """Log training loss every N steps."""
    save_every: int = 200
    """Write a resumable checkpoint every N steps (0 = only at the end)."""
    keep_last: int = 2
    """Keep this many checkpoints."""
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """accelerate trackers: tensorboard, wandb (offline unless you set WANDB_MODE/WANDB_API_KEY or
    ran `wandb login`), or none."""
    tracker_project: str = "headstart"
    """The trackers' project name (wandb project, tensorboard run directory under logs/)."""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """accelerate mixed precision: bf16 autocasts the matmuls (target and head) to bfloat16, the
    head's master weights stay float32. On a CPU with AMX (lscpu: amx_bf16) it trains ~1.9x faster
    than fp32 (docs/results/scaling/smollm2-eagle3-train-profile-cpu.md); on AVX2 alone it does not pay."""
    compile: bool = False
    """Compile the frozen target's feature forward and the EAGLE-3 unroll (forward and backward)
    with torch.compile, dynamic shapes (headstart.train.compiled): faster steps after a first
    one that compiles for minutes on a small CPU. EAGLE-3 online training only (other heads and
    offline features run eagerly)."""
    cpu: bool = False
    """Force CPU even when a GPU is present."""
    time_budget_s: float = 0.0
    """Stop cleanly before this many seconds of the run (start-up included): the steps done are
    saved as a checkpoint and `--resume` continues exactly where the run stopped, so several short
    runs give the heads one long run would (a GPU lent for ~10 minutes at a time). 0 = no budget.
    `headstart train --time-budget 9m` sets it."""
    heap_trim_every: int = 4
    """On CPU (Linux, glibc): return the C heap's free pages to the OS every N optimizer steps
    (0 = never). Without it RSS climbs for hours (an EAGLE-3 run: 11 GB for a ~3 GB working set);
    each trim makes the next step fault its buffers in again. See headstart/train/heap.py."""

    def __post_init__(self) -> None:
        if self.max_steps == 0 and not self.init_from:
            raise HeadstartError(
                "max_steps=0 trains nothing: it only re-saves (and evaluates) heads given by init_from",
                "set max_steps >= 1, or set init_from",
            )
        for name in ("batch_size", "grad_accum", "topk", "eval_every", "log_every"):
            if getattr(self, name) < 1:
                raise HeadstartError(
                    f"{name} must be >= 1, got {getattr(self, name)}", f"set {name}=1 or more"
                )
        for name, example in (("save_every", "200 (0 = only at the end)"), ("eval_batches", "0 (all)")):
            if getattr(self, name) < 0:
                raise HeadstartError(
                    f"{name} must be >= 0, got {getattr(self, name)}", f"set {name}={example}"
                )
        from headstart.inference.plain import check_seed

        check_seed(self.seed, "seed")
        if not self.time_budget_s >= 0:
            raise HeadstartError(
                f"time_budget_s must be >= 0, got {self.time_budget_s}", "e.g. --time-budget 9m (0 = none)"
            )
        if self.heap_trim_every < 0:
            raise HeadstartError(
                f"heap_trim_every must be >= 0, got {self.heap_trim_every}",
                "set heap_trim_every=4 (0 = never)",
            )
        if self.max_steps < 0:
            raise HeadstartError(f"max_steps must be >= 0, got {self.max_steps}", "set max_steps=1000")
        if self.keep_last < 1:
            raise HeadstartError("keep_last must be >= 1", "set keep_last=2")
        from headstart import kinds

        if self.lora.enabled and not kinds.get(self.head.kind).joint_lora:
            joint = [k.name for k in kinds.KINDS.values() if k.joint_lora]
            raise HeadstartError(
                f"lora.enabled (joint training through LoRA, Medusa-2) is not an option of {self.head.kind} heads",
                f"set head.kind={' or '.join(joint)}" if joint else "drop lora.enabled",
            )
        if isinstance(self.loss, dict):  # a recipe's keys; a section object is kept as given
            self.loss = section(kinds.get(self.head.kind).section("loss"), self.loss, "loss.", self.head.kind,
                                kinds.section_keys("loss"))  # fmt: skip
        if self.lora.enabled and self.data.mode == "offline":
            raise HeadstartError(
                "Medusa-2 (lora.enabled) trains the target: it cannot use cached features",
                "set data.mode=online",
            )
        unknown = [t for t in self.trackers if t not in ("tensorboard", "wandb", "none")]
        if unknown:
            raise HeadstartError(
                f"unknown trackers {unknown}", "use trackers=[tensorboard], [wandb] or [none]"
            )
