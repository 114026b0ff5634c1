"""What the commands share: their common options' checks, and how a bad value is reported.

Checks raise ``UsageProblem`` (exit 2 with one line, in ``main()``). Heavy modules are imported
inside the checks so ``--help`` stays fast.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING, List, Optional

import typer

from agent import exitcodes

if TYPE_CHECKING:
    from agent.records import Options

SEVERITY_CHOICES = ("info", "warning", "error", "critical", "never")


class UsageProblem(Exception):
    """Bad input the user can fix; exit 2 with one line."""


def fail_level(fail_on: str) -> Optional[int]:
    """--fail-on, checked, as a severity rank (None: never fail on findings)."""
    from agent.records import severity_rank

    if fail_on not in SEVERITY_CHOICES:
        raise UsageProblem("--fail-on must be one of {}".format(", ".join(SEVERITY_CHOICES)))
    return None if fail_on == "never" else severity_rank(fail_on)


def analysis_options(margin: float, request_tokens: int) -> "Options":
    """--margin and --request-tokens, checked, as analysis Options."""
    from agent.records import Options

    if margin < 0 or margin != margin:  # margin != margin: NaN passes every comparison
        raise UsageProblem("--margin must be a number of GiB >= 0")
    if request_tokens <= 0:
        raise UsageProblem("--request-tokens must be a positive number of tokens")
    return Options(margin_bytes=int(margin * (1 << 30)), request_tokens=request_tokens)


def check_log_spec(log: Optional[str]) -> None:
    """--log: PATH, journal:UNIT or docker:NAME, checked here before anything is collected."""
    from collectors.engine_logs import LogSpecError, parse_spec

    if log is not None:
        try:
            parse_spec(log)
        except LogSpecError as exc:
            raise UsageProblem(str(exc)) from None


def exit_for_findings(level: Optional[int], findings: "List[object]") -> None:
    """Exit 1 when a finding is at least as severe as --fail-on."""
    from agent.records import severity_rank

    if level is not None and any(severity_rank(f.severity) >= level for f in findings):  # type: ignore[attr-defined]
        raise typer.Exit(exitcodes.EXIT_FINDINGS)


def use_color(color: Optional[bool]) -> bool:
    """--color/--no-color, else colour only on a terminal and without NO_COLOR."""
    if color is not None:
        return color
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def terminal_width() -> int:
    """Columns to render for: the terminal's, 120 when piped, never under 80."""
    return max(80, shutil.get_terminal_size((120, 24)).columns)
