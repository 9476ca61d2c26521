"""User-facing input errors: one line, ``file:line: field: message``."""

from __future__ import annotations

import reprlib

__all__ = ["MAX_FIELD_CHARS", "MAX_MESSAGE_CHARS", "InputError", "excerpt"]

MAX_MESSAGE_CHARS = 1000  # one line a terminal can show, whatever went into it
MAX_FIELD_CHARS = 120  # a field path is built from the user's keys: a key of any length is cut to this

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 2, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 40, 40, 40


def excerpt(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to a short excerpt: bounded work and length whatever the value (deep, huge, aliased)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a hostile __repr__: say what it is, not what it holds
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InputError(Exception):
    """Bad user input (YAML, topology, CLI argument), located where possible.

    The CLI prints ``str(err)`` on one line and exits with status 2.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(self.__str__())

    def located(self, *, file: str | None = None, line: int | None = None,
                field: str | None = None) -> InputError:
        """Return a copy with missing location parts filled in."""
        return InputError(self.message, file=self.file or file,
                          line=self.line if self.line is not None else line,
                          field=self.field or field)

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line is not None else "") + ": "
        name = self.field or ""
        field = f"{name if len(name) <= MAX_FIELD_CHARS else name[: MAX_FIELD_CHARS - 3] + '...'}: " if name else ""
        text = " ".join(f"{where}{field}{self.message}".split())
        return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."
