"""One error type for everything a user can fix; the CLI prints it as one line, exit status 2."""

from __future__ import annotations


class HeadstartError(Exception):
    """An error the user can act on: what went wrong, and the exact fix.

    The CLI prints `error: <what>` followed by `fix: <fix>` and exits with status 2; the
    traceback only appears with `--debug`.
    """

    status = 2
    """The CLI's exit status for it."""

    def __init__(self, what: str, fix: str | None = None) -> None:
        self.what = what
        self.fix = fix
        super().__init__(what if fix is None else f"{what} (fix: {fix})")

    def one_line(self) -> str:
        return printable(f"error: {self.what}" + (f" -- fix: {self.fix}" if self.fix else ""))


def printable(text: str) -> str:
    """`text` on one line, safe for any stream: newlines folded, and the lone surrogates that
    Python makes of argv or stdin bytes that are not UTF-8 written as escapes (\\udcff)."""
    return " ".join(text.splitlines()).encode("utf-8", "backslashreplace").decode("utf-8")


class Interrupted(HeadstartError):
    """Ctrl-C or SIGTERM stopped a long command after it kept its work: one line saying what was
    kept and how to go on, exit status 130 (the shell's convention for an interrupt)."""

    status = 130
