"""Every JSON file headstart writes and reads back later (a cached verdict, a stored tune, a
command's mark, a run's state) is read through `read_record`: the file's fields against a typed
dataclass, so a file that is valid JSON but wrong (a field missing, of another type, out of range)
is told in one line naming the file and the field, never a KeyError or ValueError traceback three
calls later. A cache is recomputed when damaged (the caller catches `DamagedFile`); a file the user
made or must keep is refused with its fix.

    @dataclass
    class Verdict:
        tree: str | None
        speedup: float

    verdict = read_record(path, Verdict, fix="delete it: the next run measures again")

Fields the dataclass does not name are ignored (a record carries figures for people too); value
checks live in the dataclass's `__post_init__` and raise ValueError with the reason."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from headstart.errors import HeadstartError

T = TypeVar("T")


class DamagedFile(HeadstartError):
    """A saved file that cannot be what it claims: unreadable, not JSON, or a field wrong."""

    def __init__(self, path: Path, why: str, fix: str) -> None:
        self.path, self.why = Path(path), why
        super().__init__(f"{path}: {why}", fix)


def read_json(path: str | Path, fix: str) -> Any:
    """The JSON value in `path`; DamagedFile when it cannot be read, is not UTF-8 or not JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DamagedFile(path, "not UTF-8 text", fix) from None
    except OSError as err:
        raise DamagedFile(path, f"cannot be read ({err.strerror or err})", fix) from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise DamagedFile(path, f"not JSON ({err})", fix) from None


def read_record(path: str | Path, cls: type[T], fix: str) -> T:
    """`path`'s JSON object as a `cls` (a dataclass): each named field checked against its type,
    then `cls.__post_init__`'s value checks; DamagedFile naming the field otherwise."""
    return parse_record(read_json(path, fix), cls, path, fix)


def parse_record(value: Any, cls: type[T], path: str | Path, fix: str) -> T:
    """`value` (a JSON value read from `path`) as a `cls`, checked as `read_record` checks it."""
    if not isinstance(value, dict):
        raise DamagedFile(Path(path), f"holds {_kind(value)}, not a JSON object", fix)
    hints = typing.get_type_hints(cls)
    given = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name not in value:
            if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
                raise DamagedFile(Path(path), f"has no '{item.name}'", fix)
            continue
        why = mismatch(value[item.name], hints[item.name])
        if why:
            raise DamagedFile(Path(path), f"'{item.name}' {why}", fix)
        given[item.name] = value[item.name]
    try:
        return cls(**given)
    except (ValueError, TypeError) as err:
        raise DamagedFile(Path(path), str(err), fix) from None


def mismatch(value: Any, hint: Any) -> str:
    """'' when `value` (from JSON) has the type `hint` names, else why not, in words."""
    if hint is Any:
        return ""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if any(not mismatch(value, option) for option in options):
            return ""
        return f"is {_kind(value)}, not {' or '.join(_name(o) for o in options)}"
    if hint is type(None):
        return "" if value is None else f"is {_kind(value)}, not null"
    if origin is list:
        if not isinstance(value, list):
            return f"is {_kind(value)}, not a list"
        (inner,) = typing.get_args(hint) or (Any,)
        for index, item in enumerate(value):
            why = mismatch(item, inner)
            if why:
                return f"item {index} {why}"
        return ""
    if origin is dict:
        if not isinstance(value, dict):
            return f"is {_kind(value)}, not an object"
        _, inner = typing.get_args(hint) or (str, Any)
        for key, item in value.items():
            why = mismatch(item, inner)
            if why:
                return f"'{key}' {why}"
        return ""
    if hint is float:  # JSON has one number type: an integer is a float too (not a boolean)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    return "" if ok else f"is {_kind(value)}, not {_name(hint)}"


def _name(hint: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    return {list: "a list", dict: "an object"}.get(origin, getattr(hint, "__name__", str(hint)))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, str):
        return f'"{value[:40]}"' + ("..." if len(value) > 40 else "")
    if isinstance(value, int | float):
        return f"{value}"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
