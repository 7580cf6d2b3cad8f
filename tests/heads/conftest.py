from __future__ import annotations

import pytest
from tiny import make_target_dir


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_root):
    return make_target_dir(tiny_root, "qwen2")


@pytest.fixture(scope="session")
def llama_target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


@pytest.fixture(scope="session")
def qwen2_target(tiny_qwen2):
    from headstart.targets import load_target

    return load_target(str(tiny_qwen2))
