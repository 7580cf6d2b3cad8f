from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def distill_target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


@pytest.fixture
def make_cfg(tmp_path):
    """A DistillConfig for the tiny target with small, fast settings (overridable)."""
    from headstart.distill import DatafreeConfig, DistillConfig

    def build(**overrides):
        settings = dict(
            out=str(tmp_path / "out"),
            num=4,
            max_new_tokens=6,
            max_prompt_tokens=400,
            batch_size=2,
            shard_size=2,
        )
        settings.update(overrides)
        if isinstance(settings.get("datafree"), dict):
            settings["datafree"] = DatafreeConfig(**settings["datafree"])
        return DistillConfig(**settings)

    return build
