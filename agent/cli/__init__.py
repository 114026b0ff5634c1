"""Command line: ``kvforensics COMMAND``. Thin Typer commands over plain functions, one module each.

``main()`` is the only place that turns outcomes into exit codes (agent/cli/exitcodes.py).
Heavy modules (rich, the model, paramiko) are imported inside commands so ``--help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from agent.cli import analyze, deploy, exitcodes, history, inspect, probe, record, serve, watch
from agent.cli.options import UsageProblem

__all__ = ["app", "entry", "main", "UsageProblem"]

app = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Explain where an LLM inference server's GPU memory went, and what to change to turn "
    "free memory into KV tokens and concurrent requests. Sizes are GiB on screen, bytes in JSON. "
    "Environment: NO_COLOR disables colour; KVFORENSICS_DEBUG=1 shows tracebacks of internal errors.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            sys.stdout.write("kvforensics {}\n".format(version("kvforensics")))
        except PackageNotFoundError:
            sys.stdout.write("kvforensics (not installed: running from a source tree)\n")
        raise typer.Exit(exitcodes.EXIT_OK)


@app.callback()
def _group(
    show_version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                      help="Print the version and exit."),
) -> None:
    """Explain where an LLM inference server's GPU memory went (see COMMAND --help)."""


# Registered here, in the order `kvforensics --help` lists them.
app.command("analyze", short_help="Explain GPU memory from an engine's startup log, offline.")(analyze.analyze)
app.command("inspect", short_help="Inspect nodes live (here or over SSH), reconciled.")(inspect.inspect)
app.command("record", short_help="Sample into history; export Prometheus metrics (cron).")(record.record)
app.command("serve", short_help="Serve /metrics and /healthz, sampling on scrape (DaemonSet).")(serve.serve)
app.command("history", short_help="Low-water free memory and peak KV use over time.")(history.history_cmd)
app.command("watch", short_help="Live view of free GPU memory and KV usage.")(watch.watch)
app.command("probe", short_help="Write the exact probe shipped to inspected hosts.")(probe.probe)
app.command("deploy-files", short_help="Write cron, systemd, alert, Kubernetes, Grafana files.")(deploy.deploy_files)
app.command("schema", short_help="Print a published JSON Schema (report, snapshot, history).")(deploy.schema)


# What --help shows for each value (typer's defaults read <str>, <list[str]>, {log}).
METAVARS = {
    "--hosts-file": "FILE", "--save": "FILE", "--from": "FILE", "--ssh-config": "FILE", "--db": "FILE",
    "--prom-file": "FILE", "--output": "FILE", "--identity": "FILE", "--nvml-lib": "PATH", "--model-config": "PATH",
    "--log": "SPEC", "--request-tokens": "N", "--startup": "N", "--parallel": "N", "--samples": "N", "--count": "N",
    "--timeout": "SECONDS", "--interval": "SECONDS", "--engine": "PORT", "--fail-on": "SEVERITY",
    "--format": "FORMAT", "--keep": "DURATION", "--listen": "ADDR:PORT", "--min-interval": "DURATION",
    "--since": "DURATION", "--sort": "KEY",
    "targets": "HOST…", "log": "LOG",
}


def _readable_metavars(command) -> None:  # type: ignore[no-untyped-def]
    for param in getattr(command, "params", ()):
        names = list(getattr(param, "opts", ())) + [param.name or ""]
        label = next((METAVARS[n] for n in names if n in METAVARS), None)
        if label is not None and not getattr(param, "is_flag", False):
            param.metavar = label
        if getattr(param, "param_type_name", "") == "argument":
            # "LOG", "[HOST…]..." like every other tool, not typer's "{log}" and "<list[str]>"
            param.display_type_rich = lambda ctx: None
            shown = param.metavar or (param.name or "").upper()
            usage = shown if param.required else "[{}]".format(shown)
            param.get_usage_pieces = lambda ctx, usage=usage: [usage]
    for sub in getattr(command, "commands", {}).values():
        _readable_metavars(sub)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: run the app, map every outcome to a documented exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command = typer.main.get_command(app)
        _readable_metavars(command)
        result = command.main(args=args, prog_name="kvforensics", standalone_mode=False)
        return int(result) if isinstance(result, int) else exitcodes.EXIT_OK
    except UsageProblem as exc:
        sys.stderr.write("kvforensics: error: {}\n".format(exc))
        return exitcodes.EXIT_USAGE
    except typer.Exit as exc:
        return int(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        return exitcodes.EXIT_INTERRUPTED
    except BrokenPipeError:
        return exitcodes.EXIT_OK
    except Exception as exc:  # noqa: BLE001 — the one place that turns bugs into exit 4
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click's UsageError family
            return _usage_error(exc)
        if os.environ.get("KVFORENSICS_DEBUG"):
            raise
        sys.stderr.write("kvforensics: internal error: {}: {} (rerun with KVFORENSICS_DEBUG=1 for a "
                         "traceback, and please report it)\n".format(type(exc).__name__, exc))
        return exitcodes.EXIT_INTERNAL


def _usage_error(exc: Exception) -> int:
    """Exit 2 with click's one-line message; bare ``kvforensics`` gets the help itself, plainly on stdout
    (it is what was wanted, not an error to read), and still exits 2: no command ran, which a script
    that lost its arguments must notice. Matched by name, as typer does: typer may vendor click."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        sys.stdout.write(exc.format_message().rstrip("\n") + "\n")  # type: ignore[attr-defined]
    else:
        sys.stderr.write("kvforensics: error: {}\n".format(exc.format_message()))  # type: ignore[attr-defined]
    return exitcodes.EXIT_USAGE


def entry() -> None:
    sys.exit(main())
