"""Errors a user can cause, reported as one line with file and line.

Every stage raises :class:`MambalayaError` (or a subclass) for bad input; the
CLI turns it into ``file:line: message`` on stderr and exit code 2, so a user
never sees a traceback for a mistake of their own.
"""

from __future__ import annotations

import difflib


class MambalayaError(Exception):
    """A user-facing error: what is wrong, where, and what to do."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line

    def located(self, file: str | None = None, line: int | None = None) -> MambalayaError:
        """Fill in a location the raiser did not know (keeps one already set)."""
        if self.file is None:
            self.file = file
        if self.line is None:
            self.line = line
        return self

    def __str__(self) -> str:
        if self.file is None and self.line is None:
            return self.message  # not about a file (no GPU, a bad option): nothing to point at
        where = self.file or "<input>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.message}"


class CascadeError(MambalayaError):
    """A malformed cascade file or Einsum."""


class ArchError(MambalayaError):
    """A malformed architecture spec."""


class MappingError(MambalayaError):
    """A malformed or illegal mapping."""


class WeightsError(MambalayaError):
    """A checkpoint or config that does not fit the cascade."""


def did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options`` to a mistyped ``word``, or nothing."""
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
