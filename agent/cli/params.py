"""How a command declares its parameters, without importing typer.

A command is a plain function whose parameters are annotated ``Annotated[T, Option("--name", help=...)]``
(or ``Argument(...)``). These are records of what typer's ``Option`` / ``Argument`` would be called with:
``agent/cli/__init__.py`` hands them to typer when it builds the one command that runs (help, completion,
every error message). Typer reads the command line; the command modules stay importable without it (a
test calls a command's function directly, the docs list its parameters).

A command that ends with a status other than 0 raises ``ExitStatus`` (typer's ``Exit`` needs typer).
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["Argument", "ExitStatus", "Option", "Param", "declared"]


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


def declared(command: Callable[..., Any]) -> List[Tuple[inspect.Parameter, Any, Optional[Param]]]:
    """Each parameter of a command: the parameter itself (name, default), its type (what ``Annotated`` wraps)
    and the Param it is declared with (None: none, or more than one). What both readers of a command read."""
    hints = typing.get_type_hints(command, include_extras=True)
    out = []
    for p in inspect.signature(command).parameters.values():
        hint = hints.get(p.name)
        found = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Param)]
        out.append((p, typing.get_args(hint)[0] if found else hint, found[0] if len(found) == 1 else None))
    return out


class ExitStatus(Exception):
    """End the command with this exit status (main() returns it; nothing is printed)."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code
