"""``kvforensics analyze LOG``: explain GPU memory from an SGLang startup log, offline."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from agent.cli.options import (
    UsageProblem,
    analysis_options,
    exit_for_findings,
    fail_level,
    terminal_width,
    use_color,
)


def analyze(
    log: str = typer.Argument(..., help="SGLang log: a file, a .gz file, or - for stdin.", show_default=False),
    startup: int = typer.Option(-1, "--startup", help="Which startup: 1 = first in the file, -1 = last, -2 = the one before."),
    model_config: Optional[str] = typer.Option(None, "--model-config", help="config.json (or the model directory) to compute bytes per token from the architecture."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON report (schema kvforensics.report/1)."),
    fail_on: str = typer.Option("warning", "--fail-on", help="Exit 1 when a finding is at least this severe: info, warning, error, critical, never."),
    margin: float = typer.Option(2.0, "--margin", help="GiB to keep free for runtime activations when sizing recommendations."),
    request_tokens: int = typer.Option(8192, "--request-tokens", help="Tokens per request (prompt + output) for concurrency estimates."),
    exact_lines: bool = typer.Option(False, "--exact-lines", help="Count line numbers even in huge logs (reads the whole file)."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Force colour on or off (default: on for a terminal)."),
) -> None:
    """Explain an SGLang server's GPU memory from its startup log, offline."""
    from dataclasses import replace

    from agent.sglang.analysis import analyze_startup
    from collectors.logfile import LogReadError, read_log
    from collectors.model_config import ModelConfigError, load_model_config
    from reports import json_report

    level = fail_level(fail_on)
    opts = analysis_options(margin, request_tokens)
    target = "file:" + log
    try:
        cfg = load_model_config(model_config) if model_config else None
        excerpt = read_log(log, startup, count_lines=exact_lines)
    except (LogReadError, ModelConfigError) as exc:
        message = getattr(exc, "message", str(exc))
        if as_json:
            code = "log." + getattr(exc, "code", "model_config")
            sys.stdout.write(json_report.render([], [json_report.error_target(target, "error", code, message)]))
        raise UsageProblem(message) from None
    opts = replace(opts, model_config=cfg, model_config_path=model_config)
    analysis = analyze_startup(excerpt.startup, target, opts, excerpt.index, excerpt.count, excerpt.notes)
    if as_json:
        sys.stdout.write(json_report.render([analysis]))
    else:
        from reports import terminal

        sys.stdout.write(terminal.render([analysis], color=use_color(color), width=terminal_width()))
    exit_for_findings(level, list(analysis.findings))
