"""The one assembly point: target + heads + tree -> a decoder. `generate`, `chat`, `serve`, `bench`
and `tune` all come through here, so heads are resolved and loaded once, the tree `headstart tune`
stored with them is read once, and a `--tree` value is parsed once into a TreeChoice.

    from headstart.speculator import load_speculator
    from headstart.targets import load_target

    target = load_target("smollm2")
    speculator = load_speculator(target)            # the heads shipped for it, their tuned tree
    out = speculator.decoder.generate([target.chat.user_prompt_ids("Hi!")])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.trees.spec import TreeChoice, choose_tree


@dataclass
class Speculator:
    """Heads loaded for a target, the tree they decode with, and decoders built from both."""

    target: Any
    heads: Any
    """The loaded heads (None: plain decoding through the same engine)."""
    heads_path: Path | None
    """Where they were loaded from (None for heads passed as objects, or none)."""
    tree: TreeChoice | None
    """The tree decoders draft (None: plain decoding, or the heads' default static tree)."""
    typical: bool = False
    compile: bool = False
    note: str = ""
    """Why the heads were set aside (calibration found no tree faster than plain decoding here)."""

    def new_decoder(self, greedy: bool = True, tree: str | TreeChoice | None = None) -> SpeculativeDecoder:
        """A fresh decoder of these heads (a server's lane, a tuning candidate): `tree` overrides
        the speculator's for this one. `greedy=False` (a sampling lane) drops a static tree's lookup
        branch: exact acceptance cannot mix a static tree's drawn drafts with looked-up tokens."""
        choice = self.tree if tree is None else choose_tree(tree)
        if not greedy and choice is not None:
            choice = choice.for_sampling()
        return SpeculativeDecoder(self.target, self.heads, tree=choice, typical=self.typical,
                                  compile=self.compile)  # fmt: skip

    @property
    def decoder(self) -> SpeculativeDecoder:
        """The decoder with the speculator's own tree (built once)."""
        if not hasattr(self, "_decoder"):
            self._decoder = self.new_decoder()
        return self._decoder

    @property
    def mode(self) -> str:
        """What decodes, in words (the CLI's stats line, the server's /health)."""
        if self.heads is None:
            return (
                "plain decoding"
                + (", compiled" if self.compile else "")
                + (", the drafts do not pay on this machine" if self.note else "")
            )
        drafts = getattr(self.heads, "describe", None) or f"{self.heads.kind} heads"
        return (
            f"{drafts}, tree {self.tree.text if self.tree else 'static'}"
            + (", compiled" if self.compile else "")
            + (", typical acceptance (LOSSY)" if self.typical else "")
        )


def load_speculator(
    target: Any,
    heads: str | Path | Any | None = None,
    tree: str | TreeChoice | None = None,
    *,
    plain: bool = False,
    greedy: bool = True,
    typical: bool = False,
    compile: bool = False,
    calibrate: bool = False,
    draft_model: str | None = None,
    draft_larger_ok: bool = False,
) -> Speculator:
    """Assemble decoding for `target`.

    heads: a heads directory or Hub id, loaded heads, or None for the heads shipped for the target
    (plain decoding when there are none); `plain=True` decodes without heads whatever is shipped.
    tree: a `--tree` value (parsed here, once) or a TreeChoice; None takes the tree `headstart tune`
    stored with the heads (noting on stderr when it was tuned for another device or thread count),
    else the default static tree. `greedy=False` drops a tuned tree's lookup branch (exact sampling
    cannot mix a static tree's drawn drafts with looked-up tokens). `calibrate=True` (the CLI's
    `--speculate auto`): without an explicit tree, unless the stored tune was measured on this
    machine, measure once whether the heads beat plain decoding here, and decode plainly when they
    do not (headstart/calibration.py). `draft_model`: draft with a separate model instead of heads
    (headstart/drafts.py; `draft_larger_ok`: a draft not smaller than the target is tried with a
    warning) or a registered drafter (early-exit:K, lookahead[:sizes]); its tree: `tree`, else the one `headstart tune
    --draft-model` stored for this machine, else the draft models' default chain."""
    import torch

    if draft_model is not None:
        return _draft_speculator(target, draft_model, tree, heads, plain, greedy, typical, compile,
                                 draft_larger_ok, calibrate)  # fmt: skip

    from headstart.tuned import tree_for_run

    choice = choose_tree(tree) if tree is not None else None
    loaded, path = (None, None) if plain else _heads(target, heads)
    if loaded is None and choice is not None:  # a lookup-only tree too: generate's plain path has none
        raise HeadstartError(
            f"--tree {choice.text} needs heads: {getattr(target, 'spec', 'the target')} has no shipped heads"
            if not plain
            else f"--tree {choice.text} drafts with heads, and plain decoding has none",
            "pass --heads DIR (trained heads), or drop --tree for plain decoding",
        )
    if loaded is not None and choice is None and calibrate and path is not None and not typical:
        from headstart.calibration import drafts_ident
        from headstart.tuned import stored_tune

        stored = _parsable(stored_tune(path), path)
        trees = [*([stored["tree"]] if stored else []), "chain:1", "chain:2", "[[0],[0,0],[1]]"]
        return _calibrated(
            target, loaded, path, drafts_ident(path), trees, stored, greedy, compile, "the heads"
        )
    if loaded is not None:
        choice = tree_for_run(choice, path, str(target.device), torch.get_num_threads(), greedy)
    return Speculator(target, loaded, path, choice, typical=typical, compile=compile)


def _draft_speculator(target: Any, spec: str, tree: str | TreeChoice | None, heads: Any, plain: bool,
                      greedy: bool, typical: bool, compile: bool, larger_ok: bool,
                      calibrate: bool = False) -> Speculator:  # fmt: skip
    """A speculator drafting with a draft model (headstart/drafts.py) or a registered drafter with
    nothing to train (headstart.kinds.DRAFT_KINDS: Lookahead, early exit) in place of heads."""
    from headstart import kinds
    from headstart.calibration import drafts_ident
    from headstart.drafts import DEFAULT_TREE, load_draft_model

    if heads is not None or plain:
        raise HeadstartError(
            "--draft-model drafts in place of heads: it cannot be combined with "
            + ("--heads" if heads is not None else "--no-heads"),
            "pass one of them",
        )
    explicit, asked = tree is not None, spec.strip()
    tuned = False
    if tree is None:  # what a tune stored here: the tree (and for a bare kind name, its sizes or layer)
        spec, tree, tuned = _tuned_draft(target, spec.strip())
    if tuned and calibrate and not typical:  # tuned here: its verdict stands, plain decoding included
        from headstart.calibration import verdict_of
        from headstart.tuned import stored_draft_tune

        if verdict_of(stored_draft_tune(target, asked) or {"tree": tree}) is None:
            note = f"the tune stored for --draft-model {spec} says plain decoding is faster here"
            import logging

            logging.getLogger(__name__).warning("note: %s; --speculate always uses it anyway", note)
            return Speculator(target, None, None, None, compile=compile, note=note)
    kind = kinds.draft_kind(spec)
    if kind is not None:
        drafter, choice = kinds.load(kind.load)(target, spec, tree, greedy)
        if calibrate and not explicit and not tuned and not typical and kind.own_tree:
            own = {spec: choice}
            return _calibrated(target, drafter, None, drafts_ident(None, spec), [spec], None, greedy, compile,
                               f"the drafter {spec}", own)  # fmt: skip
    else:
        choice = choose_tree(tree if tree is not None else DEFAULT_TREE)
        drafter = load_draft_model(spec, target, allow_larger=larger_ok)
    if calibrate and not explicit and not tuned and not typical:
        trees = list(dict.fromkeys([choice.text, "chain:1", "chain:2"]))
        return _calibrated(target, drafter, None, drafts_ident(None, spec), trees, None, greedy, compile,
                           f"the draft {spec}")  # fmt: skip
    if not greedy:
        choice = choice.for_sampling()
    return Speculator(target, drafter, None, choice, typical=typical, compile=compile)


def _calibrated(target: Any, drafter: Any, path: Path | None, ident: str, candidates: list[str],
                stored: dict[str, Any] | None, greedy: bool, compile: bool, what: str,
                own: dict[str, TreeChoice] | None = None) -> Speculator:  # fmt: skip
    """A speculator with the candidate the calibration (headstart/calibration) says pays here, or
    plain decoding (its note said on stderr) when none does. `own`: a drafter's own trees by
    candidate name (it builds its tree each step: the candidates are its specs)."""
    import logging

    from headstart.calibration import decide

    if not greedy:  # sampling: a static tree's lookup branch cannot be verified exactly
        candidates = [c for c in candidates if own or "+lookup" not in c] or ["chain:1"]
    candidates = list(dict.fromkeys(candidates))

    def tree_of(name: str) -> TreeChoice:
        choice = own[name] if own else choose_tree(name)
        return choice if greedy or own else choice.for_sampling()

    def build(name: str) -> SpeculativeDecoder:
        return SpeculativeDecoder(target, drafter, tree=tree_of(name))

    chosen, note = decide(target, ident, candidates, build, stored, what)
    if chosen is None:
        logging.getLogger(__name__).warning("note: %s", note)
        return Speculator(target, None, path, None, compile=compile, note=note)
    return Speculator(target, drafter, path, tree_of(chosen), compile=compile)


def _parsable(stored: dict[str, Any] | None, path: Path) -> dict[str, Any] | None:
    """A stored tune whose tree parses, else None (said: the tune is an optimisation only)."""
    if stored is None:
        return None
    try:
        choose_tree(stored["tree"])
    except HeadstartError as err:  # as tree_for_run says it
        import logging

        logging.getLogger(__name__).warning(
            f"warning: the tuned tree stored with {path} is not a tree ({err.what}): ignored"
        )
        return None
    return stored


def _tuned_draft(target: Any, spec: str) -> tuple[str, str | None, bool]:
    """(draft, tree, True) from `headstart tune --draft-model SPEC`'s stored report when it was
    measured on this machine at this thread count; else (SPEC, None: the default chain, False)."""
    import torch

    from headstart.calibration import stored_tune_fits
    from headstart.tuned import stored_draft_tune

    stored = stored_draft_tune(target, spec)
    if stored_tune_fits(stored, str(target.device), torch.get_num_threads()):
        assert stored is not None
        return stored["draft"], stored["draft_tree"] or None, True  # "": a drafter's own tree
    return spec, None, False


def _heads(target: Any, heads: str | Path | Any | None) -> tuple[Any, Path | None]:
    """(loaded heads, their directory) for `heads` as `load_speculator` takes it."""
    from headstart.heads import load_heads_for_inference
    from headstart.heads.defaults import default_heads
    from headstart.heads.resolve import resolve_heads

    if heads is None:
        shipped = default_heads(getattr(target, "spec", ""))
        return (None, None) if shipped is None else (load_heads_for_inference(shipped, target), shipped)
    if isinstance(heads, str | Path):
        path = resolve_heads(heads)
        return load_heads_for_inference(path, target), path
    return heads, None  # an object: loaded heads or a Drafter (the decoder binds what it is given)
