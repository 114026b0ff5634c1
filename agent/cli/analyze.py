"""``kvforensics analyze LOG``: explain GPU memory from an engine's startup log, offline."""

from __future__ import annotations

import sys
from typing import Annotated

from kvforensics.agent.cli.options import (
    FAIL_ON,
    MARGIN_GIB,
    REQUEST_TOKENS,
    Color,
    Detail,
    FailOn,
    Margin,
    ModelConfigLog,
    ReportFormatLog,
    ReportJson,
    RequestTokens,
    Startup,
    UsageProblem,
    analysis_options,
    exit_for_findings,
    fail_level,
    report_format,
    terminal_width,
    use_color,
)
from kvforensics.agent.cli.params import Argument, Option


def analyze(
    log: Annotated[str, Argument(help="The engine's log: a file, a .gz file, or - for stdin.",
                                 show_default=False)],
    startup: Startup = -1,
    model_config: ModelConfigLog = None,
    fmt: ReportFormatLog = None,
    as_json: ReportJson = False,
    fail_on: FailOn = FAIL_ON,
    margin: Margin = MARGIN_GIB,
    request_tokens: RequestTokens = REQUEST_TOKENS,
    exact_lines: Annotated[bool, Option("--exact-lines",
                                        help="Count line numbers even in huge logs (reads the whole "
                                             "file).")] = False,
    color: Color = None,
    detail: Detail = False,
    engine_kind: Annotated[str, Option("--engine-kind", metavar="ENGINE",
                                       help="Whose log it is: auto (from its line shapes) or an "
                                            "engine's name (an unknown name lists them).")] = "auto",
) -> None:
    """Explain an inference server's GPU memory from its startup log, offline."""
    from dataclasses import replace

    from kvforensics.agent.model.analyze import analyze_startup
    from kvforensics.collectors.logfile import LogReadError, read_log
    from kvforensics.collectors.model_config import ModelConfigError, load_model_config
    from kvforensics.reports import json_report

    level = fail_level(fail_on)
    fmt = report_format(fmt, as_json)
    opts = analysis_options(margin, request_tokens)
    target = "file:" + log
    try:
        cfg = load_model_config(model_config) if model_config else None
        _not_our_json(log)
        excerpt = read_log(log, startup, count_lines=exact_lines, engine=engine_kind)
    except (LogReadError, ModelConfigError) as exc:
        message = _no_engine(log, exc, engine_kind) or getattr(exc, "message", str(exc))
        if fmt == "json":
            code = "log." + getattr(exc, "code", "model_config")
            sys.stdout.write(json_report.render([], [json_report.error_target(target, "error", code, message)]))
        raise UsageProblem(message) from None
    opts = replace(opts, model_config=cfg, model_config_path=model_config)
    analysis = analyze_startup(excerpt.startup, target, opts, excerpt.index, excerpt.count, excerpt.notes)
    if fmt == "json":
        sys.stdout.write(json_report.render([analysis]))
    elif fmt == "oneline":
        from kvforensics.reports import oneline

        sys.stdout.write(oneline.render_analyses([analysis]))
    elif fmt == "markdown":
        from kvforensics.reports import markdown

        sys.stdout.write(markdown.render([analysis], detail=detail))
    else:
        from kvforensics.reports import terminal

        sys.stdout.write(terminal.render([analysis], color=use_color(color), width=terminal_width(), detail=detail))
    exit_for_findings(level, list(analysis.findings))


def _not_our_json(log: str) -> None:
    """kvforensics' own JSON (a bundle from --save, a snapshot, a probe's answer) is not an engine's log, even where
    it carries a log's lines: LogReadError naming what it is and where it belongs (``inspect --from``)."""
    from kvforensics.collectors.logfile import LogReadError

    if log == "-":
        return
    try:
        with open(log, "rb") as f:
            head = f.read(4096)
    except OSError:
        return  # the reader says why, in its words
    text = head.lstrip()
    ours = text.startswith(b"{") and (b'"kvforensics.' in text or text[1:].lstrip().startswith(b'"collector_runs"'))
    if ours or head.startswith(b"KVF-PROBE ") or b"\nKVF-PROBE {" in head:
        raise LogReadError("usage", "{}: this is kvforensics' own JSON (an evidence bundle or a probe's answer), not "
                           "an engine's log: read it with `kvforensics inspect --from {}`".format(log, log))


def _no_engine(log: str, exc: Exception, engine_kind: str) -> str:
    """Under ``--engine-kind auto`` every engine was looked for, not the first one's lines alone: said so. "" to keep
    the reader's own message."""
    if getattr(exc, "code", "") != "no_startup" or engine_kind != "auto":
        return ""
    from kvforensics.collectors.plugin import ENGINES

    looked = "; ".join("{}: {}".format(e.display, e.no_startup_hint) for e in ENGINES.all())
    return "{}: no startup lines of any engine found (looked for {})".format(log, looked)
