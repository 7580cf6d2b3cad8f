"""Typed configs: dataclasses per stage, loaded from YAML plus dotted command-line overrides.

Every stage (distill, train, generate, bench) owns a frozen-shape dataclass whose fields carry a
docstring-style comment. `load_config(cls, path, overrides)` reads YAML, applies `a.b=c` overrides
and builds the dataclass; any unknown key is a `HeadstartError` that names the offending flag and
suggests the closest valid one (difflib). Values from the command line are parsed as YAML scalars,
so `train.lr=3e-4`, `heads.kind=eagle3` and `layers=[1,2,3]` all do what they look like.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from headstart.errors import HeadstartError

C = TypeVar("C")


def _closest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else f"; valid keys: {', '.join(sorted(options))}"


def _unwrap_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


EVALUATION_ONLY = {"resumable": True}
"""Field metadata of a setting that only changes how a run is evaluated or logged (a kind's
`loss.eval_steps`): `--resume` may change it (headstart.train.checkpoints)."""
YAML_BOOLS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}


def _coerce(value: Any, tp: Any, flag: str) -> Any:
    """Check (and gently convert) one value against its annotation; errors name the flag."""
    if value is None:
        if tp is Any or _optional(tp):
            return None
        if typing.get_origin(tp) in (list, tuple):  # a YAML null list: none (`data.eval_path=null`)
            return [] if typing.get_origin(tp) is list else ()
        raise HeadstartError(f"'{flag}' must not be empty (null)", f"give {flag} a value, or leave it out")
    tp = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise HeadstartError(
                f"'{flag}' must be a mapping, got {value!r}", f"write it as {flag}.KEY=VALUE"
            )
        return _build(tp, value, prefix=f"{flag}.")
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        if isinstance(value, str | int | float):
            value = [value]
        if not isinstance(value, list | tuple):
            raise HeadstartError(f"'{flag}' must be a list, got {value!r}", f"for example {flag}=[1,2]")
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, flag) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool):  # YAML 1.1 reads a bare no/off/yes/on as a boolean
            spelt = [c for c in YAML_BOOLS[value] if c in choices]
            value = spelt[0] if len(spelt) == 1 else value
        if value not in choices:
            raise HeadstartError(
                f"'{flag}' must be one of {list(choices)}, got {value!r}", f"set {flag}={choices[0]}"
            )
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise HeadstartError(
                f"'{flag}' must be a mapping, got {value!r}", f"write {flag} as KEY: VALUE pairs"
            )
        return value
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise HeadstartError(f"'{flag}' must be true or false, got {value!r}", f"set {flag}=true")
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads "3e-4" (no dot) as a string; users write it that way on the command line.
        try:
            value = tp(value)
        except ValueError:
            pass
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):  # no setting means anything at nan or inf
            raise HeadstartError(
                f"'{flag}' must be a finite number, got {value!r}", f"fix the value of {flag}"
            )
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str | int | float):
        return str(value)
    if isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value  # (bool is an int subclass: `max_steps=true` is a mistake, not 1)
    raise HeadstartError(
        f"'{flag}' expects {getattr(tp, '__name__', tp)}, got {value!r}", f"fix the value of {flag}"
    )


def _build(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("section")}
    # a class with a kind's own section (HeadSpec) takes the keys it does not declare itself and
    # files them (`section`); every other class refuses them here
    sectioned = any(f.metadata.get("section") for f in dataclasses.fields(cls))
    kwargs = {}
    for key, value in data.items():
        if key not in fields and sectioned:
            kwargs[key] = value
            continue
        if key not in fields:
            raise HeadstartError(
                f"unknown config key '{prefix}{key}'{_closest(key, list(fields))}",
                f"check the spelling of '{prefix}{key}' in the recipe or on the command line",
            )
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field without a default
        raise HeadstartError(
            f"incomplete config {cls.__name__}: {err}", "add the missing key to the recipe"
        ) from None


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`["a.b=1", "c=x"]` -> `{"a": {"b": 1}, "c": "x"}`; values are parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not key:
            raise HeadstartError(f"cannot parse override '{item}'", "write overrides as dotted.key=value")
        value = yaml.safe_load(raw) if raw.strip() else ""
        node = tree
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                section = ".".join(parts[: depth + 1])
                raise HeadstartError(
                    f"override '{item}': '{section}' was given a value, so it has no key '{parts[depth + 1]}'",
                    f"give {section} one value, or set keys under it only",
                )
        node[parts[-1]] = value
    return tree


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise HeadstartError(
            f"recipe {path} is a directory", "pass a YAML file, e.g. recipes/smollm2-medusa-cpu.yaml"
        )
    if not path.is_file():
        raise HeadstartError(f"recipe file not found: {path}", "pass an existing YAML file, e.g. recipes/")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise HeadstartError(
            f"recipe {path} is not UTF-8 text (byte {err.object[err.start : err.start + 1].hex()} at {err.start})",
            "save the recipe as UTF-8 YAML",
        ) from None
    except yaml.YAMLError as err:
        raise HeadstartError(
            f"recipe {path} is not valid YAML: {err}".replace("\n", " "), "fix the YAML syntax"
        ) from None
    if not isinstance(data, dict):
        raise HeadstartError(f"recipe {path} must be a YAML mapping at top level", "write key: value pairs")
    return data


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """Build `cls` from an optional YAML recipe and dotted overrides (overrides win)."""
    data = read_yaml(path) if path else {}
    data = merge(data, parse_overrides(overrides or []))
    return _build(cls, data)


def build(cls: type[C], data: dict[str, Any]) -> C:
    """`cls` from plain data (a saved config): unknown keys refused, missing ones at their defaults."""
    return _build(cls, data)


def section(cls: type[C] | None, data: dict[str, Any], prefix: str, kind: str,
            others: dict[str, list[tuple[str, Any]]]) -> C | None:  # fmt: skip
    """A kind's own section of a recipe's keys: `cls` (a dataclass; None: the kind has no keys of
    its own) built from `data`. A key only other kinds take (`others`: key -> [(kind, default)]) is
    refused naming them, unless it sits at its default (it says nothing: configs saved before the
    sections existed hold every kind's keys); any other unknown key is refused as `_build` does."""
    own = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    kept = {}
    for key, value in data.items():
        if key in own:
            kept[key] = value
            continue
        takers = others.get(key, [])
        if takers and all(value == default for _, default in takers):
            continue
        if takers:
            names = " and ".join(dict.fromkeys(name for name, _ in takers))
            raise HeadstartError(
                f"{prefix}{key} is an option of {names} heads, not of {kind} heads",
                f"drop {prefix}{key}, or use head.kind={takers[0][0]}",
            )
        raise HeadstartError(
            f"unknown config key '{prefix}{key}'{_closest(key, sorted(own | set(others)))}",
            f"check the spelling of '{prefix}{key}' in the recipe or on the command line",
        )
    return _build(cls, kept, prefix) if cls is not None else None


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain YAML-able data (tuples become lists); a kind's section (a field marked
    `section`) is written inline, its keys beside its parent's, as recipes write them."""
    return _plain(_data(config))


def _data(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = _data(getattr(value, f.name))
            if f.metadata.get("section"):
                out.update(item or {})
            else:
                out[f.name] = item
        return out
    if isinstance(value, dict):
        return {k: _data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_data(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def check_threads(threads: int, flag: str = "--threads") -> None:
    """0 (torch's default) up to this machine's CPUs: more only oversubscribes the cores, and torch
    fails far beyond (it cannot start the threads)."""
    cpus = os.cpu_count() or 1
    if not 0 <= threads <= cpus:
        raise HeadstartError(
            f"{flag} must be in 0..{cpus} (this machine's CPUs), got {threads}",
            f"use {flag} 1, or 0 for torch's default",
        )
