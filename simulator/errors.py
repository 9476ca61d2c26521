"""User-facing input errors: one line, ``file:line: field: message``."""

from __future__ import annotations

__all__ = ["InputError"]


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
        field = f"{self.field}: " if self.field else ""
        return " ".join(f"{where}{field}{self.message}".split())
