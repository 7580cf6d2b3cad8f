"""Compatibility: the target layer is `headstart.targets` (a package named `target/` is ignored by
GitHub's standard Python .gitignore, whose PyBuilder section lists `target/`, so a contributor's
new file there was silently never committed). `from headstart.target import load_target` keeps
working; import submodules from `headstart.targets`."""

from headstart.targets import *  # noqa: F403
from headstart.targets import __all__  # noqa: F401
