"""``kvforensics watch``: a live view of free GPU memory and KV usage."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from agent.cli.options import UsageProblem, use_color


def watch(
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes."),
    count: int = typer.Option(0, "--count", help="Stop after this many refreshes (0 = until Ctrl-C)."),
    nvml_lib: Optional[str] = typer.Option(None, "--nvml-lib", help="Load libnvidia-ml.so.1 from this path."),
    http: bool = typer.Option(True, "--http/--no-http", help="Ask the engine's loopback HTTP API for KV usage."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Force colour on or off."),
) -> None:
    """Live view: free memory per GPU with a sparkline, and the engine's KV usage. Ctrl-C leaves."""
    from agent import watch as watch_mod

    if interval <= 0 or count < 0:
        raise UsageProblem("--interval must be > 0 and --count >= 0")
    try:
        watch_mod.run(interval, count, nvml_lib, http, color=use_color(color))
    except KeyboardInterrupt:
        sys.stderr.write("\n")
