"""The typed configuration of `headstart distill` (recipe YAML, dotted overrides and CLI flags)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from headstart.errors import HeadstartError

SHAPES = ("auto", "sharegpt", "messages", "ultrachat", "alpaca", "mtbench", "prompt", "text")
Shape = Literal["auto", "sharegpt", "messages", "ultrachat", "alpaca", "mtbench", "prompt", "text"]


@dataclass
class DatafreeConfig:
    """How the target writes its own user prompts when no prompt set is given."""

    temperature: float = 1.0
    """Sampling temperature for the prompts (high: varied prompts)."""
    top_p: float = 0.95
    """Nucleus cut-off for the prompts (drops the long tail where garbage lives)."""
    max_prompt_tokens: int = 96
    """A prompt that has not ended (end-of-turn) within this many tokens is rejected as too long."""
    min_words: int = 3
    """Reject prompts with fewer words."""
    max_repeat_ratio: float = 0.5
    """Reject prompts whose word 3-grams repeat more than this fraction (loops like 'the the the')."""
    min_text_ratio: float = 0.8
    """Reject prompts where letters, digits, spaces and common punctuation are below this fraction."""
    filter: bool = True
    """Apply the length/repetition/garbage filters (dedupe always applies)."""
    max_attempts: int = 8
    """Sample at most max_attempts * num candidate prompts before giving up."""
    batch_size: int = 16
    """Candidate prompts sampled per target call."""

    def __post_init__(self) -> None:
        if not 0 < self.temperature < float("inf"):  # nan too
            raise HeadstartError(
                f"datafree.temperature must be a finite number > 0, got {self.temperature}",
                "use datafree.temperature=1.0",
            )
        if not 0 < self.top_p <= 1:
            raise HeadstartError(
                f"datafree.top_p must be in (0, 1], got {self.top_p}", "use datafree.top_p=0.95"
            )
        for name in ("max_prompt_tokens", "max_attempts", "batch_size"):
            if getattr(self, name) < 1:
                raise HeadstartError(
                    f"datafree.{name} must be >= 1, got {getattr(self, name)}", f"set datafree.{name}=8"
                )


@dataclass
class DistillConfig:
    """Everything `headstart distill` needs; the settings that change the data are fixed per output dir."""

    out: str = ""
    """Output directory (created; rerunning the same command resumes it)."""
    target: str = "smollm2"
    """Hub id, local model directory, .gguf file, or 'smollm2' (the embedded default)."""
    dtype: str = "float32"
    """Target weights dtype: float32, bfloat16, float16 or auto."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto."""
    threads: int = 0
    """CPU threads for torch (0 = torch's default, one per core). On a CPU shared with other jobs, 1 can
    be several times faster: oversubscribed threads spin-wait for each other."""
    revision: str | None = None
    """Hub revision of the target (branch, tag or commit)."""
    chat_template: str | None = None
    """A chat template file (or the Jinja text) for a target whose tokenizer has none (base models,
    many GGUF files); None = the tokenizer's own."""
    prompts: str | None = None
    """Prompt source: a .json/.jsonl/.parquet file (optionally .gz), a local dataset directory or a Hub
    dataset name; None = data-free (the target writes its own prompts)."""
    split: str = "train"
    """Dataset split, for dataset directories and Hub names."""
    shape: Shape = "auto"
    """Row shape: auto, sharegpt, messages, ultrachat, alpaca, mtbench, prompt or text."""
    field: str | None = None
    """Column holding the prompt or conversation (e.g. 'question' for GSM8K); None = by shape."""
    system: str | None = None
    """System message prepended to every conversation; None = the template's own default."""
    skip_rows: int = 0
    """Start at this source row: more data from later prompts without repeating an earlier run's,
    or a separate held-out set from the end of a file (rows keep their index as the resume key)."""
    num: int = 1000
    """Number of records (conversations) wanted in the output, counting those already there."""
    max_turns: int = 0
    """Regenerate at most this many user turns per conversation (0 = all)."""
    followups: int = 0
    """A self-conversation: after the conversation's own turns the target writes this many more
    user turns itself (sampled with the `datafree` settings, filtered like data-free prompts), each
    answered after its own earlier replies, so histories grow long (headstart engine only)."""
    documents: int = 0
    """Long-document tasks (distill/documents.py): the target first writes a document of up to
    this many tokens on each row's first user turn (a genre picked per row, sampled with the
    `datafree` settings), and that turn becomes the document followed by a task about it
    (summarise, list its points, ...): long prompts from short ones, data-free with no --prompts
    (headstart engine only; 0 = off)."""
    max_new_tokens: int = 256
    """Longest reply per turn, in tokens."""
    temperature: float = 0.0
    """0 = greedy replies; > 0 samples."""
    top_p: float = 1.0
    """Nucleus sampling for replies."""
    top_k: int = 0
    """Top-k sampling for replies (0 = no limit)."""
    seed: int = 0
    """Seed for sampling (replies and data-free prompts); each batch reseeds from it."""
    engine: Literal["headstart", "generate", "dataset", "openai"] = "headstart"
    """Who writes the replies: `headstart` (continuous batching through headstart's decoding
    engine, the one `generate` and `serve` run: the fast default), `generate` (transformers' generate over static batches, any model),
    `dataset` (no generation: the data's own assistant turns, rendered with the target's chat
    template; a conversation ends at its first user turn without a reply), or `openai` (an
    OpenAI-compatible chat-completions server serving the target: base_url and model)."""
    base_url: str | None = None
    """--engine openai: the server's OpenAI API root, e.g. http://localhost:8000/v1."""
    model: str | None = None
    """--engine openai: the model name the server serves the target under."""
    api_key: str | None = None
    """--engine openai: the bearer token (default: $OPENAI_API_KEY, or none)."""
    concurrency: int = 8
    """--engine openai: requests in flight at once."""
    max_retries: int = 5
    """--engine openai: retries per request (backoff 1, 2, 4... s, or the server's Retry-After)."""
    batch_size: int = 64
    """Conversations in flight at once (headstart engine: finished rows are refilled at once;
    generate engine: one left-padded batch). Memory: the KV cache of this many conversations."""
    max_prompt_tokens: int = 1024
    """Skip rows whose rendered prompt is longer; later turns past it end the conversation."""
    min_prompt_tokens: int = 0
    """Skip rows whose rendered first prompt is shorter (0 = none): a long-context set from a
    source whose short rows another run already answered (e.g. 257 after a run at 256)."""
    shard_size: int = 256
    """Records per shard (a shard is also written after flush_seconds)."""
    flush_seconds: float = 120.0
    """Write a (smaller) shard at least this often so a crash loses little work."""
    cache_features: bool = False
    """Also store the target's hidden states for each record (offline training)."""
    feature_layers: str = "eagle3"
    """Layers to cache: ids like '1,14,25' (output of decoder layer i), 'eagle3', 'last', or a mix."""
    feature_dtype: Literal["float16", "bfloat16"] = "float16"
    """Storage dtype of cached features."""
    max_feature_gb: float = 20.0
    """Refuse to start when the estimated feature size exceeds this many GB."""
    datafree: DatafreeConfig = dataclasses.field(default_factory=DatafreeConfig)
    """Settings of the data-free prompt writer."""

    def __post_init__(self) -> None:
        if not self.out:
            raise HeadstartError("no output directory given", "pass --out DIR (or out: DIR in the recipe)")
        if self.engine == "openai" and self.base_url:
            from headstart.distill.api import check_base_url

            check_base_url(self.base_url)
        if self.engine == "openai" and not (self.base_url and self.model):
            raise HeadstartError(
                "--engine openai needs the server's --base-url and --model",
                "e.g. --base-url http://localhost:8000/v1 --model meta-llama/Llama-3.1-8B-Instruct",
            )
        for name in ("num", "max_new_tokens", "batch_size", "max_prompt_tokens", "shard_size", "concurrency"):
            if getattr(self, name) < 1:
                raise HeadstartError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}",
                    f"set {name} to a positive number",
                )
        if self.skip_rows < 0:
            raise HeadstartError(f"skip_rows must be >= 0, got {self.skip_rows}", "use skip_rows=0")
        if not 0 <= self.min_prompt_tokens <= self.max_prompt_tokens:
            raise HeadstartError(
                f"--min-prompt-tokens must be in [0, --max-prompt-tokens ({self.max_prompt_tokens})], "
                f"got {self.min_prompt_tokens}",
                "use 0 for no lower bound, or raise --max-prompt-tokens",
            )
        from headstart.config import check_threads
        from headstart.inference.plain import check_seed

        check_threads(self.threads)
        check_seed(self.seed)
        if self.followups < 0:
            raise HeadstartError(f"--followups must be >= 0, got {self.followups}", "use 0 for none")
        if self.followups and self.engine != "headstart":
            raise HeadstartError(
                f"--followups needs --engine headstart (the target writes the next user turns), not {self.engine}",
                "use --engine headstart, or --followups 0",
            )
        if self.documents < 0:
            raise HeadstartError(f"--documents must be >= 0, got {self.documents}", "use 0 for none")
        if self.documents and self.engine != "headstart":
            raise HeadstartError(
                f"--documents needs --engine headstart (the target writes the documents), not {self.engine}",
                "use --engine headstart, or --documents 0",
            )
        if self.max_turns < 0:
            raise HeadstartError(f"--max-turns must be >= 0, got {self.max_turns}", "use 0 for all turns")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise HeadstartError(
                f"--temperature must be a finite number >= 0, got {self.temperature}", "use 0 for greedy"
            )
        if not 0 < self.top_p <= 1:
            raise HeadstartError(f"--top-p must be in (0, 1], got {self.top_p}", "use --top-p 1.0")
        if self.top_k < 0:
            raise HeadstartError(f"--top-k must be >= 0, got {self.top_k}", "use --top-k 0")
        if not self.max_feature_gb > 0:  # NaN too
            raise HeadstartError(
                f"--max-feature-gb must be > 0, got {self.max_feature_gb}", "use --max-feature-gb 20"
            )
        if not self.flush_seconds > 0:
            raise HeadstartError(
                f"flush_seconds must be > 0, got {self.flush_seconds}", "use flush_seconds=120"
            )

    def identity(self) -> dict[str, object]:
        """The settings that change what a record contains: an output dir is bound to them.

        num, batch_size, shard_size, flush_seconds, device, threads, max_feature_gb and the data-free
        sampler's batch_size/max_attempts may change between runs (greedy replies are the same at any
        batch size up to float rounding; data-free prompts are saved once written).
        """
        keys = (
            "prompts", "split", "shape", "field", "system", "max_turns", "max_new_tokens", "temperature",
            "top_p", "top_k", "seed", "max_prompt_tokens", "dtype", "cache_features", "feature_dtype",
        )  # fmt: skip
        out: dict[str, object] = {k: getattr(self, k) for k in keys}
        out["feature_layers"] = self.feature_layers if self.cache_features else None
        if self.min_prompt_tokens:  # only when set: outputs written before it still resume
            out["min_prompt_tokens"] = self.min_prompt_tokens
        if self.documents:  # the same; the documents follow the data-free settings
            out["documents"] = self.documents
        if (
            self.followups or self.documents
        ):  # the same; what the target writes follows the data-free settings
            if self.followups:
                out["followups"] = self.followups
            out["datafree"] = {
                k: getattr(self.datafree, k) for k in DatafreeConfig.__dataclass_fields__
                if k not in ("batch_size", "max_attempts")
            }  # fmt: skip
        if self.chat_template is not None:  # only when set: outputs written before it still resume
            out["chat_template"] = self.chat_template
        if self.engine == "dataset":  # the data's replies, not the target's: never mixed in one dir
            out["replies"] = "dataset"
        if self.prompts is None:
            out["datafree"] = {
                k: getattr(self.datafree, k)
                for k in DatafreeConfig.__dataclass_fields__
                if k not in ("batch_size", "max_attempts")
            }
        return out
