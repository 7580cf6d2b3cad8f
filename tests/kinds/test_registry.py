"""Every registered head kind's pieces are where its registration says, and nothing else names
the kinds: the registry is the one switch."""

from __future__ import annotations

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


def test_the_built_in_kinds_are_registered():
    assert kinds.names()[:4] == ("medusa", "eagle", "eagle3", "dflash")
