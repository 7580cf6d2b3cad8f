"""What a head is (the recipe's `head:` section) and what its checkpoint records (config.json)."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal

from headstart import kinds
from headstart.errors import HeadstartError

FORMAT = "headstart-heads/1"
MAX_BLOCKS = 64
"""Upper bound on a checkpoint's num_heads and num_layers (Medusa uses ~3-5 heads of 1-2 layers):
a damaged config must not build a million modules before its weights are compared."""


class Sectioned:
    """What HeadSpec and HeadConfig share: the kind's own keys in `options` (a dataclass named by
    its HeadKind), built from the keywords the shared fields leave, and read back as attributes."""

    kind: str
    options: Any

    def _own(self, which: str, options: Any, keys: dict[str, Any], prefix: str) -> Any:
        """`options` as given, else the kind's `which` section built from `keys` (another kind's
        key refused naming its kinds, headstart.config.section); never both."""
        from headstart.config import section

        if options is not None and keys:
            raise TypeError(
                f"{type(self).__name__} takes its kind's keys in options or as keywords, not both: {sorted(keys)}"
            )
        if options is not None:
            return options
        return section(
            kinds.get(self.kind).section(which), keys, prefix, self.kind, kinds.section_keys(which)
        )

    def own_fields(self) -> list[dataclasses.Field]:
        """The fields of the kind's section ([] for a kind without one)."""
        options = self.__dict__.get("options")
        return list(dataclasses.fields(options)) if options is not None else []

    def __getattr__(self, name: str) -> Any:
        """`spec.block_size`, `config.num_heads`: the kind's own key (only reached for names the
        class lacks)."""
        if name in {f.name for f in self.own_fields()}:
            return getattr(self.__dict__["options"], name)
        raise AttributeError(f"{self.__dict__.get('kind')} heads have no '{name}'")


@dataclass(init=False)
class HeadSpec(Sectioned):
    """The head to train, as written in a recipe's `head:` section: the keys every kind reads,
    and the kind's own keys (HeadKind.head_section, e.g. headstart.heads.medusa.MedusaOptions)
    in `options`, read back as `spec.KEY` too. Recipes write them all flat (`head.num_heads=4`)."""

    kind: str = kinds.DEFAULT
    """A registered head kind (headstart.kinds): medusa (Medusa-1/2), eagle (EAGLE-1/2),
    eagle3, dflash (a block drafter: one forward drafts block_size - 1 tokens) or draft_model."""
    num_layers: int | None = None
    """Medusa: residual blocks `x + SiLU(Linear(x))` per head (default 1). DFlash: draft decoder
    layers (default 1). EAGLE-3 (reference layout): draft decoder layers (default 1;
    the first reads the token and the feature, the others are plain decoder layers, as in
    speculators); more than 1 stays in headstart's own format (export refuses it). draft_model:
    the target's first layers the draft model starts from (fewer than the target's)."""
    init_layers: Literal["random", "target"] = "random"
    """DFlash and EAGLE-3 (reference layout): how the draft layers start. random: fresh, as
    speculators, z-lab and the EAGLE release train them; target: copies of the target layer after
    the deepest tap, fc passing that tap (a warm start: see DFlashHead.init_layers_from_target and
    Eagle3Head.init_layers_from_target)."""
    feature_layers: list[int] | None = None
    """EAGLE-3: three target layer ids (low, middle, high); DFlash: one or more; None = the
    EAGLE-3 reference's taps (headstart.targets.eagle3_layer_ids), which are also speculators'
    DFlash default. Ids follow headstart.targets.features."""
    draft_vocab_size: int = 0
    """EAGLE-3, Medusa and DFlash: size N of the draft vocabulary (the N most frequent target
    tokens in the training data); 0 = the full target vocabulary. EAGLE-3 trains its own N-row
    lm_head; Medusa trains over the full vocabulary and drafts over the N tokens only (a cheaper
    draft step); DFlash scores its training loss and drafts over those N rows of the target's
    lm_head (its checkpoint stays full-vocabulary: other runtimes draft over every token)."""
    layout: str | None = None
    """Which of the kind's head classes (HeadKind.heads) it builds; None: the kind's default (its
    first layout), and kinds with one layout have "fc". EAGLE-3: "reference" (the default: the
    EAGLE-3 release's layout, which vLLM, SGLang, speculators and llama.cpp load; `headstart
    export` writes it) or "fc" (headstart's first layout, not exportable). See
    headstart.heads.eagle. Another kind's layout name says nothing (saved configs hold
    "reference" for every kind: it was the shared default)."""
    options: Any = field(default=None, metadata={"section": True})
    """The kind's own keys (its HeadKind.head_section), written inline in recipes and saved configs."""

    def __init__(self, kind: str = kinds.DEFAULT, num_layers: int | None = None,
                 init_layers: Literal["random", "target"] = "random", feature_layers: list[int] | None = None,
                 draft_vocab_size: int = 0, layout: str | None = None,
                 options: Any = None, **keys: Any) -> None:  # fmt: skip
        self.kind, self.num_layers, self.init_layers = kind, num_layers, init_layers
        found = kinds.get(kind)  # one line naming the registered kinds
        others = {name for k in kinds.KINDS.values() for name in k.heads}
        if layout is None or (layout not in found.heads and layout in others):
            layout = found.default_layout
        self.feature_layers, self.draft_vocab_size, self.layout = feature_layers, draft_vocab_size, layout
        self.options = self._own("head", options, keys, "head.")
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.num_layers is None:
            self.num_layers = 1
        if self.num_layers < 1:
            raise HeadstartError(
                f"head.num_layers must be >= 1, got {self.num_layers}", "set head.num_layers=1"
            )
        if self.draft_vocab_size < 0:
            raise HeadstartError("head.draft_vocab_size must be >= 0", "use 0 for the full vocabulary")
        if self.init_layers not in ("random", "target"):
            raise HeadstartError(
                f"unknown head.init_layers '{self.init_layers}'", "use head.init_layers=random (or target)"
            )
        kind = kinds.get(self.kind)
        if self.layout not in kind.heads:
            raise HeadstartError(
                f"unknown head.layout '{self.layout}'",
                f"use head.layout={' or '.join(kind.heads)}, or leave it out",
            )
        head_class = kind.head_class(self.layout)
        if self.init_layers == "target" and not hasattr(head_class, "init_layers_from_target"):
            raise HeadstartError(
                f"head.init_layers=target: {self.kind} heads ({self.layout} layout) have no warm start from "
                "the target's layers",
                "drop head.init_layers (DFlash and EAGLE-3's reference layout have one)",
            )
        self._check_layout_options(kind, head_class)
        self._check_taps(kind)

    def _check_layout_options(self, kind: Any, head_class: type) -> None:
        """A key only some layouts' classes take (their `options`: EAGLE-3's fc_norm, more than one
        draft layer) set away from its default for a class that does not take it is refused."""
        values = {"num_layers": (self.num_layers, 1)}
        values.update({f.name: (getattr(self.options, f.name), _default(f)) for f in self.own_fields()})
        bound = {
            name for k in kinds.KINDS.values() for layout in k.heads for name in k.head_class(layout).options
        }
        given = [name for name, (value, default) in values.items()
                 if name in bound and value != default and name not in head_class.options]  # fmt: skip
        if given:
            owners = [f"{k.name} ({layout} layout)" for k in kinds.KINDS.values() for layout in k.heads
                      if given[0] in k.head_class(layout).options]  # fmt: skip
            raise HeadstartError(
                f"head.{given[0]} is an option of {' and '.join(owners) or 'no'} heads, not of this "
                f"{self.kind} head ({self.layout} layout)",
                f"drop head.{given[0]}" + (f", or use a {owners[0]} head" if owners else ""),
            )

    def _check_taps(self, kind: Any) -> None:
        least, most = kind.taps or (0, 0)
        if (
            self.feature_layers is not None
            and kind.taps
            and not least <= len(self.feature_layers) <= (most or 10**6)
        ):
            count = f"{least}" if least == most else f"at least {least}"
            raise HeadstartError(
                f"head.feature_layers must name {count} target layer{'s' if (most or 2) > 1 else ''} for "
                f"{self.kind}, got {self.feature_layers}",
                "set head.feature_layers=[1,14,26] or leave it unset for the default taps",
            )
        if self.feature_layers is not None and list(self.feature_layers) != sorted(set(self.feature_layers)):
            # the engines (vLLM) gather their aux states walking the layers upward, once each: any
            # other order would feed an exported head's fc its blocks permuted (or too few)
            raise HeadstartError(
                f"head.feature_layers must be increasing, without repeats, got {self.feature_layers}",
                f"set head.feature_layers={sorted(set(self.feature_layers))}",
            )


LOCAL_KEYS = ("_name_or_path", "_commit_hash")
"""transformers config fields that say where this machine loaded a model from."""


SHAPE = {"shape": True}
"""Field metadata of a kind's config section: a warm start (init_from) must match the recipe in it
(the head's modules are built from it); unmarked fields (DFlash's block_size) may change."""


@dataclass(init=False)
class HeadConfig(Sectioned):
    """A head checkpoint's config.json: its shape, the target it belongs to, how it was trained.
    The fields every kind has, and the kind's own (HeadKind.config_section, e.g.
    headstart.heads.medusa.MedusaConfig) in `options`, read back as `config.KEY` and written
    inline: the file stays one flat mapping."""

    kind: str
    hidden_size: int
    vocab_size: int
    target: dict[str, Any]
    """The target's fingerprint (headstart.targets.load.fingerprint)."""
    target_config: dict[str, Any]
    """The target's transformers config (EAGLE heads build their decoder layer from it)."""
    num_layers: int = 1
    feature_layers: list[int] = field(default_factory=list)
    draft_vocab_size: int = 0
    layout: str = "fc"
    """EAGLE-3: "reference" or "fc" (HeadSpec.layout); "fc" for every checkpoint written before
    the field existed, and for kinds with one layout."""
    training: dict[str, Any] = field(default_factory=dict)
    """Free-form: data, steps, held-out accuracies (written by the trainer, shown in the model card)."""
    format: str = FORMAT
    options: Any = field(default=None, metadata={"section": True})
    """The kind's own fields (its HeadKind.config_section; None: it has none)."""

    def __init__(self, kind: str, hidden_size: int, vocab_size: int, target: dict[str, Any],
                 target_config: dict[str, Any], num_layers: int = 1, feature_layers: list[int] | None = None,
                 draft_vocab_size: int = 0, layout: str = "fc", training: dict[str, Any] | None = None,
                 format: str = FORMAT, options: Any = None, **fields: Any) -> None:  # fmt: skip
        self.kind, self.hidden_size, self.vocab_size = kind, hidden_size, vocab_size
        self.target, self.target_config, self.num_layers = target, target_config, num_layers
        self.feature_layers = list(feature_layers or [])
        self.draft_vocab_size, self.layout, self.format = draft_vocab_size, layout, format
        self.training = dict(training or {})
        self.options = self._own("config", options, fields, "")
        self.__post_init__()

    def __post_init__(self) -> None:
        # transformers' record of where the target was loaded from (for the embedded GGUF: this
        # machine's conversion cache) is no part of the head and must not travel with it; a kind's
        # own transformers configs (its draft layers') neither
        own = [getattr(self.options, f.name) for f in self.own_fields()]
        for config in [self.target_config, *(value for value in own if isinstance(value, dict))]:
            for key in LOCAL_KEYS:
                config.pop(key, None)
        if self.format != FORMAT:
            raise HeadstartError(f"unsupported head format '{self.format}'", f"this headstart reads {FORMAT}")
        if not self.draft_vocab_size:
            self.draft_vocab_size = self.vocab_size
        kind = kinds.get(self.kind)
        if self.layout not in kind.heads:
            raise HeadstartError(
                f"head layout '{self.layout}' is not valid for a {self.kind} head",
                f"{self.kind} heads have the {' or '.join(kind.heads)} layout",
            )
        kind.head_class(self.layout).check_config(self)

    def shape(self) -> tuple[str, ...]:
        """The fields a warm start (init_from) must share with the recipe's head: the shared
        ones, and the kind's own marked SHAPE."""
        own = [f.name for f in self.own_fields() if f.metadata.get("shape")]
        return ("kind", "hidden_size", "vocab_size", "num_layers", "feature_layers", "draft_vocab_size",
                "layout", *own)  # fmt: skip

    @classmethod
    def for_target(cls, target: Any, kind: str, **fields: Any) -> HeadConfig:
        """A config of a `kind` head on `target` (a headstart Target): the target's sizes,
        fingerprint and transformers config filled in, the rest from `fields`."""
        base = {
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
            "target": dict(target.fingerprint),
            "target_config": target.model.config.to_dict(),
        }
        return cls(kind=kind, **(base | fields))

    def portable(self) -> HeadConfig:
        """This config as it may leave the machine (export, push): a target loaded from a local
        folder or file is named by that folder's name, not this machine's path (and so is
        anything of the kind's own that names one: its section's `portable()`)."""
        target = dict(self.target)
        if target.get("kind") not in ("hub", "embedded") and isinstance(target.get("name"), str):
            target["name"] = Path(target["name"]).name
        from headstart.provenance import portable

        options = self.options.portable() if hasattr(self.options, "portable") else self.options
        return dataclasses.replace(self, target=target, training=portable(self.training), options=options)

    def to_json(self) -> str:
        """The file: one flat mapping, the kind's own fields beside the shared ones."""
        from headstart.config import to_dict

        return json.dumps(to_dict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, path: str | Path) -> HeadConfig:
        """The config.json of a head directory, every field checked against its type: a missing
        key, a string where a number belongs or an unknown key is one line naming the key and
        the file (a hand-edited or damaged checkpoint must not fail later as a shape error).
        Files written before the kinds' sections hold every kind's fields: another kind's at its
        default is dropped, away from it refused."""
        from headstart.heads.files import read_json

        file = Path(path) / "config.json"
        data = read_json(file)
        shared = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("section")}
        others = kinds.section_keys("config")
        if "kind" not in data or not (set(shared) | set(others)).issuperset(data):
            unknown = sorted(set(data) - set(shared) - set(others))
            raise HeadstartError(
                f"{file} is not a headstart head config"
                + (f" (unknown keys: {', '.join(unknown[:5])})" if unknown else " (no 'kind')"),
                "pass a directory written by headstart train or export",
            )
        own_class = kinds.get(str(data["kind"])).section("config")  # one line naming the kinds
        own = {f.name for f in dataclasses.fields(own_class)} if own_class is not None else set()
        data = {
            k: v for k, v in data.items() if k in shared or k in own or _foreign(file, k, v, data, others)
        }
        missing = [name for name, f in shared.items() if _default(f) is MISSING and name not in data]
        if missing:
            raise HeadstartError(
                f"{file} lacks {', '.join(repr(m) for m in missing)}",
                "restore the file from the run that wrote it, or re-export the heads",
            )
        nulls = [k for k, v in data.items() if v is None and k != "training"]  # no field is optional
        if nulls:
            raise HeadstartError(
                f"{file} holds null for {', '.join(repr(k) for k in nulls)}",
                "restore the file from the run that wrote it",
            )
        values = _coerced(data, cls, own_class, file)
        _check_read(values, file)
        try:
            return cls(**values)
        except HeadstartError as error:  # a kind's own check (its section, its head class)
            raise HeadstartError(f"{file}: {error.what}", error.fix) from error


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING  # type: ignore[misc]


def _foreign(file: Path, key: str, value: Any, data: dict[str, Any], others: dict[str, list]) -> bool:
    """False for another kind's field at its default (dropped); refused away from it."""
    takers = others[key]
    if all(value == default for _, default in takers):
        return False
    names = " and ".join(dict.fromkeys(name for name, _ in takers))
    raise HeadstartError(
        f"{file}: {key}={value!r} is a field of {names} heads, not of this {data['kind']} head",
        "restore the file from the run that wrote it",
    )


def _coerced(data: dict[str, Any], cls: type, own_class: type | None, file: Path) -> dict[str, Any]:
    from headstart.config import _coerce

    hints = typing.get_type_hints(cls) | (typing.get_type_hints(own_class) if own_class is not None else {})
    values = {k: _coerce(v, hints[k], f"{k} in {file}") for k, v in data.items()}
    values["training"] = values.get("training") or {}
    return values


def _check_read(values: dict[str, Any], file: Path) -> None:
    """The shared fields' bounds, before any module is built from them."""
    for key in ("hidden_size", "vocab_size", "num_layers"):
        if values.get(key, 1) < 1:
            raise HeadstartError(f"{key} in {file} must be >= 1, got {values[key]}", "restore the file")
    if values.get("num_layers", 1) > MAX_BLOCKS:
        raise HeadstartError(
            f"num_layers in {file} is {values['num_layers']}: no draft head has more than {MAX_BLOCKS}",
            "restore the file from the run that wrote it",
        )
    for key in ("hidden_size", "vocab_size"):
        recorded = values["target"].get(key)
        if recorded is not None and recorded != values[key]:
            raise HeadstartError(
                f"{file}: {key} {values[key]} disagrees with the target it records ({recorded})",
                "restore the file from the run that wrote it",
            )
    if not 0 <= values.get("draft_vocab_size", 0) <= values["vocab_size"]:
        raise HeadstartError(
            f"draft_vocab_size in {file} must be between 0 and vocab_size ({values['vocab_size']}), "
            f"got {values['draft_vocab_size']}",
            "restore the file from the run that wrote it",
        )
    layers = values.get("feature_layers") or []
    depth = values["target"].get("num_layers")
    if isinstance(depth, int) and any(not 0 <= i < depth for i in layers):
        raise HeadstartError(
            f"feature_layers {layers} in {file} name layers the {depth}-layer target does not have",
            "restore the file from the run that wrote it",
        )
    taps = kinds.get(values["kind"]).taps
    if taps and not taps[0] <= len(layers) <= (taps[1] or 10**6):
        raise HeadstartError(
            f"feature_layers in {file} must name the target layers a {values['kind']} head reads "
            f"({taps[0]}{'' if taps[1] == taps[0] else ' or more'}), got {layers}",
            "restore the file from the run that wrote it (e.g. feature_layers: [1, 14, 26])",
        )
