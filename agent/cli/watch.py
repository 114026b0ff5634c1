"""``kvforensics watch``: a live view of free GPU memory and KV usage."""

from __future__ import annotations

import sys
from typing import Annotated

from kvforensics.agent.cli.options import Color, Http, NvmlLibHere, UsageProblem, use_color
from kvforensics.agent.cli.params import Option


def watch(
    interval: Annotated[float, Option("--interval", help="Seconds between refreshes.")] = 2.0,
    count: Annotated[int, Option("--count", help="Stop after this many refreshes (0 = until Ctrl-C).")] = 0,
    nvml_lib: NvmlLibHere = None,
    http: Http = True,
    color: Color = None,
) -> None:
    """Live view: the engine's running and waiting requests and KV-cache usage, and free memory per GPU with
    sparklines on one scale. Ctrl-C leaves."""
    from kvforensics.agent.history import watch as watch_mod

    if not 0 < interval <= 86400 or count < 0:  # also NaN and infinity
        raise UsageProblem("--interval must be > 0 and --count >= 0")
    try:
        watch_mod.run(interval, count, nvml_lib, http, color=use_color(color))
    except KeyboardInterrupt:
        sys.stderr.write("\n")
