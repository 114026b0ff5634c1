"""How a command declares its parameters, without importing typer.

A command is a plain function whose parameters are annotated ``Annotated[T, Option("--name", help=...)]``
(or ``Argument(...)``). These are records of what typer's ``Option`` / ``Argument`` would be called with:
``agent/cli/__init__.py`` hands them to typer when it builds the app (help, completion, every error
message), and ``agent/cli/fastparse.py`` reads the same records to run the common invocations without
loading typer at all (~25 ms of a ~0.1 s command, bench/RESULTS.md). One declaration, two readers.

A command that ends with a status other than 0 raises ``ExitStatus`` (typer's ``Exit`` needs typer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

__all__ = ["Argument", "ExitStatus", "Option", "Param"]


@dataclass(frozen=True)
class Param:
    """One declared parameter: ``kind`` "option" or "argument", its names ("--margin", "-v",
    "--color/--no-color"), and the rest of typer's keyword arguments (help, metavar, callback, show_default)."""

    kind: str
    decls: Tuple[str, ...]
    settings: Tuple[Tuple[str, Any], ...]

    def setting(self, name: str, default: Any = None) -> Any:
        return next((v for k, v in self.settings if k == name), default)


def Option(*decls: str, **settings: Any) -> Param:  # noqa: N802 - read as typer's Option
    return Param("option", decls, tuple(sorted(settings.items())))


def Argument(**settings: Any) -> Param:  # noqa: N802 - read as typer's Argument
    return Param("argument", (), tuple(sorted(settings.items())))


class ExitStatus(Exception):
    """End the command with this exit status (main() returns it; nothing is printed)."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code
