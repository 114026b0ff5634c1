"""``kvforensics watch``: refresh a live view until Ctrl-C (or ``--count`` refreshes)."""

from __future__ import annotations

import time
from typing import Optional


def run(interval: float, count: int, nvml_lib: Optional[str], http: bool, color: bool) -> None:
    from rich.console import Console
    from rich.live import Live

    from kvforensics.agent.model.reconcile import inspect_snapshot
    from kvforensics.agent.model.records import Options
    from kvforensics.collectors import snapshot
    from kvforensics.reports import watch_view

    looks = watch_view.Looks()
    console = Console(force_terminal=color, no_color=not color, highlight=False)
    refreshes = 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            snap = snapshot.collect(nvml_lib=nvml_lib, http=http)
            insp = inspect_snapshot(snap, "local:{}".format(snap.get("hostname")), Options())
            watch_view.remember(looks, insp)
            live.update(watch_view.view(insp, looks, interval, http), refresh=True)
            refreshes += 1
            if count and refreshes >= count:
                return
            time.sleep(interval)
