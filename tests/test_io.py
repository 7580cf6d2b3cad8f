"""headstart.io: atomic writes."""

from __future__ import annotations


def test_atomic_writes_get_normal_permissions(tmp_path):
    """Published files and directories are readable like ordinary ones (mkstemp alone gives 0600)."""
    import os
    import stat

    from headstart.io import atomic_write_text, umask
    from headstart.outputs import publish_dir as atomic_dir

    written = atomic_write_text(tmp_path / "a.json", "{}")
    assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~umask()
    folder = atomic_dir(tmp_path / "heads", lambda tmp: (tmp / "x.txt").write_text("x"))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask()
    assert os.access(folder / "x.txt", os.R_OK)
