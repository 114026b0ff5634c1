"""``kvforensics history``: low-water free memory and peak KV use over time, from ``record``'s samples."""

from __future__ import annotations

import sys
from typing import Annotated

from kvforensics.agent.cli.options import Color, Db, UsageProblem, terminal_width, use_color
from kvforensics.agent.cli.params import Option


def history_cmd(
    db: Db = None,
    since: Annotated[str, Option("--since", help="Window: 7d, 12h, 90m, 2w.")] = "7d",
    as_json: Annotated[bool, Option("--json", help="Print JSON (schema kvforensics.history/1).")] = False,
    color: Color = None,
) -> None:
    """Show recorded history: per GPU and rank the low-water free memory, peak KV usage, a plot."""
    import sqlite3
    import time

    from kvforensics.agent.history import store as history
    from kvforensics.reports import history_report

    try:
        window = history.parse_duration(since)
    except ValueError as exc:
        raise UsageProblem("--since: {}".format(exc)) from None
    path = db or history.default_path()
    try:
        opened = history.open_db(path, create=False)
    except history.HistoryError as exc:
        raise UsageProblem(str(exc)) from None
    try:
        runs, plots = history.read_window(opened.conn, time.time() - window)
    except history.Corrupt as exc:
        raise UsageProblem(str(exc.at(path))) from None
    except sqlite3.OperationalError as exc:  # locked past the timeout, an I/O error
        raise UsageProblem("{}: cannot read the history: {}".format(path, " ".join(str(exc).split()))) from None
    finally:
        opened.conn.close()
    if as_json:
        from kvforensics.reports.json_report import dumps

        sys.stdout.write(dumps(history_report.to_json(path, since, runs)))
    else:
        sys.stdout.write(history_report.render(path, since, runs, plots, color=use_color(color),
                                               width=terminal_width()))
