"""Every registered head kind's pieces are where its registration says, and nothing else names
the kinds: the registry is the one switch."""

from __future__ import annotations

import dataclasses

import pytest

from headstart import kinds


@pytest.mark.parametrize("name", kinds.names())
def test_every_reference_of_a_kind_loads(name):
    from headstart.heads.formats import ADAPTERS

    kind = kinds.get(name)
    for layout in kind.heads:
        cls = kind.head_class(layout)
        assert cls.kind == name and callable(cls.spec_fields)
    drafter = kinds.load(kind.drafter)
    assert all(hasattr(drafter, member) for member in ("observe", "root_logits", "expand", "end_step",
                                                        "select_rows", "merge"))  # fmt: skip
    objective = kinds.load(kind.objective)
    assert callable(objective) and callable(objective.parts)
    assert set(kind.formats) <= set(ADAPTERS)
    for section in ("head", "loss"):  # a dataclass whose every key has a default (recipes may omit any)
        cls = kind.section(section)
        assert cls is None or dataclasses.is_dataclass(cls) and cls() is not None


@pytest.mark.parametrize("name", list(kinds.DRAFT_KINDS))
def test_every_reference_of_a_draft_kind_loads(name):
    kind = kinds.DRAFT_KINDS[name]
    for ref in (kind.load, kind.candidates, kind.default, kind.check):
        assert ref is None or callable(kinds.load(ref)), ref
    assert kinds.draft_kind(f"{name}:x=1") is kind and kinds.draft_kind(f"/models/{name}") is None


def test_the_built_in_kinds_are_registered():
    assert kinds.names()[:4] == ("medusa", "eagle", "eagle3", "dflash")
