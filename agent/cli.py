"""Command line: ``kvforensics analyze LOG``. Thin Typer commands over plain functions.

``main()`` is the only place that turns outcomes into exit codes (agent/exitcodes.py).
Heavy modules (rich, the model) are imported inside commands so ``--help`` stays fast.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING, List, Optional

import typer

from agent import exitcodes

SEVERITY_CHOICES = ("info", "warning", "error", "critical", "never")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Explain where an LLM inference server's GPU memory went, and what to change to turn "
    "free memory into KV tokens and concurrent requests. Sizes are GiB on screen, bytes in JSON. "
    "Environment: NO_COLOR disables colour; KVFORENSICS_DEBUG=1 shows tracebacks of internal errors.",
)


@app.callback()
def _group() -> None:
    """Keep subcommands even while there is only one (typer collapses single-command apps)."""


class UsageProblem(Exception):
    """Bad input the user can fix; exit 2 with one line."""


if TYPE_CHECKING:
    from agent.records import Options


def _fail_level(fail_on: str) -> Optional[int]:
    from agent.records import severity_rank

    if fail_on not in SEVERITY_CHOICES:
        raise UsageProblem("--fail-on must be one of {}".format(", ".join(SEVERITY_CHOICES)))
    return None if fail_on == "never" else severity_rank(fail_on)


def _options(margin: float, request_tokens: int) -> "Options":
    """--margin and --request-tokens, checked, as analysis Options."""
    from agent.records import Options

    if margin < 0 or margin != margin:
        raise UsageProblem("--margin must be a number of GiB >= 0")
    if request_tokens <= 0:
        raise UsageProblem("--request-tokens must be a positive number of tokens")
    return Options(margin_bytes=int(margin * (1 << 30)), request_tokens=request_tokens)


def _check_log_spec(log: Optional[str]) -> None:
    from collectors.engine_logs import LogSpecError, parse_spec

    if log is not None:
        try:
            parse_spec(log)
        except LogSpecError as exc:
            raise UsageProblem(str(exc)) from None


def _exit_for_findings(level: Optional[int], findings: "List[object]") -> None:
    from agent.records import severity_rank

    if level is not None and any(severity_rank(f.severity) >= level for f in findings):  # type: ignore[attr-defined]
        raise typer.Exit(exitcodes.EXIT_FINDINGS)


def _use_color(color: Optional[bool]) -> bool:
    if color is not None:
        return color
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


@app.command(short_help="Explain GPU memory from an SGLang startup log, offline.")
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

    from agent.analyze import analyze_startup
    from collectors.logfile import LogReadError, read_log
    from collectors.model_config import ModelConfigError, load_model_config
    from reports import json_report

    level = _fail_level(fail_on)
    opts = _options(margin, request_tokens)
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

        width = max(80, shutil.get_terminal_size((120, 24)).columns)
        sys.stdout.write(terminal.render([analysis], color=_use_color(color), width=width))
    _exit_for_findings(level, list(analysis.findings))


@app.command(short_help="Inspect nodes live (here or over SSH), reconciled.")
def inspect(
    targets: Optional[List[str]] = typer.Argument(None, help="Hosts: user@host[:port] or ssh config aliases; none or 'local' = this machine.", show_default=False),
    hosts_file: Optional[str] = typer.Option(None, "--hosts-file", help="Read targets from a file: one per line, '#' comments."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON report (schema kvforensics.report/1)."),
    detail: bool = typer.Option(False, "--detail", help="With several hosts, print each host's full report after the summary."),
    fail_on: str = typer.Option("warning", "--fail-on", help="Exit 1 when a finding is at least this severe: info, warning, error, critical, never."),
    margin: float = typer.Option(2.0, "--margin", help="GiB to keep free for runtime activations when sizing recommendations."),
    request_tokens: int = typer.Option(8192, "--request-tokens", help="Tokens per request (prompt + output) for concurrency estimates."),
    nvml_lib: Optional[str] = typer.Option(None, "--nvml-lib", help="Load the NVIDIA driver library (libnvidia-ml.so.1) from this path (on the inspected host)."),
    log: Optional[str] = typer.Option(None, "--log", help="The engine's log: PATH, journal:UNIT or docker:NAME (default: found from the process)."),
    startup: int = typer.Option(-1, "--startup", help="Which startup in the log: 1 = first, -1 = last."),
    model_config: Optional[str] = typer.Option(None, "--model-config", help="config.json or model directory (default: from --model-path)."),
    save: Optional[str] = typer.Option(None, "--save", help="Also write everything collected to this JSON evidence bundle (one target)."),
    from_file: Optional[str] = typer.Option(None, "--from", help="Analyse an evidence bundle written by --save instead of a host."),
    http: bool = typer.Option(True, "--http/--no-http", help="Ask the engine's loopback HTTP API for live metrics."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", help="OpenSSH client config to use (default ~/.ssh/config)."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown hosts' keys (like StrictHostKeyChecking accept-new); changed keys are always refused."),
    parallel: int = typer.Option(16, "--parallel", help="Hosts inspected at once."),
    db: Optional[str] = typer.Option(None, "--db", help="History from kvforensics record, read for this node's recommendations (default as for record)."),
    engine: Optional[int] = typer.Option(None, "--engine", help="Port of the SGLang server to explain when a node runs several (default: the one holding most GPU memory)."),
    timeout: float = typer.Option(30.0, "--timeout", help="Deadline per host, in seconds (connect, authenticate, probe)."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Force colour on or off (default: on for a terminal)."),
) -> None:
    """Inspect nodes live: NVML, host RAM, engine processes and their logs, reconciled (local or over SSH)."""
    from agent import bundles
    from agent.live import TargetFailure
    from agent.reconcile import inspect_snapshot
    from reports import json_report

    level = _fail_level(fail_on)
    opts = _options(margin, request_tokens)
    if parallel < 1 or timeout <= 0:
        raise UsageProblem("--parallel must be >= 1 and --timeout > 0")
    if startup == 0:
        raise UsageProblem("--startup counts from 1 (first) or from -1 (last); 0 is neither")
    _check_log_spec(log)
    names = list(targets or [])
    if hosts_file:
        from agent.fleet import read_hosts_file

        try:
            names += read_hosts_file(hosts_file)
        except OSError as exc:
            raise UsageProblem("--hosts-file {}: {}".format(hosts_file, exc.strerror or exc)) from None
    if from_file is not None and names:
        raise UsageProblem("--from reads a bundle; do not also name hosts")
    if save is not None and len(names) > 1:
        raise UsageProblem("--save writes one bundle: name one target")
    probe_options = {"nvml_lib": nvml_lib, "log": log, "startup": startup, "model_config_path": model_config,
                     "http": http, "engine": engine}
    # One entry per target, in the order given: (target, snapshot) or (target, failure)
    entries: List[tuple] = []
    if from_file is not None:
        try:
            entries.append(("bundle:{}".format(from_file), bundles.load(from_file), None))
        except bundles.BundleError as exc:
            raise UsageProblem(str(exc)) from None
    else:
        entries = _collect_targets(names or ["local"], probe_options, ssh_config, accept_new_host_keys, parallel, timeout)
    snaps = [(t, snap) for t, snap, _ in entries if snap is not None]
    if save is not None and snaps:
        try:
            bundles.save(snaps[0][1], save)
        except OSError as exc:
            raise UsageProblem("--save {}: {}".format(save, exc)) from None
    results = []  # Inspection or (target, status, code, message), in target order
    for target, snap, failure in entries:
        if snap is None:
            results.append(failure)
            continue
        recorded = None
        if target.startswith("local:"):
            from agent import history as history_mod
            from agent.record import current_stats

            recorded = current_stats(db or history_mod.default_path(), snap)
        results.append(inspect_snapshot(snap, target, opts, history=recorded))
    inspections = [r for r in results if not isinstance(r, TargetFailure)]
    failures = [r for r in results if isinstance(r, TargetFailure)]
    if as_json:
        sys.stdout.write(json_report.render_results(results))
    else:
        from reports import terminal

        width = max(80, shutil.get_terminal_size((120, 24)).columns)
        if len(results) > 1:
            sys.stdout.write(terminal.render_fleet(results, color=_use_color(color), width=width))
        if inspections and (detail or len(results) == 1):
            sys.stdout.write(terminal.render_inspections(inspections, color=_use_color(color), width=width))
    empty = [i.target for i in inspections if i.collected_nothing]
    if empty:
        sys.stderr.write("kvforensics: nothing could be collected from {}\n".format(", ".join(empty)))
    if failures or empty:
        raise typer.Exit(exitcodes.EXIT_COLLECTION_FAILED)
    _exit_for_findings(level, [f for i in inspections for f in i.findings])


def _collect_targets(names: List[str], probe_options: dict, ssh_config: Optional[str], accept_new: bool,
                     parallel: int, timeout: float) -> List[tuple]:
    """(target, snapshot, None) or (target, None, (target, status, code, message)) per name, in order."""
    from agent.live import TargetFailure
    from collectors import snapshot

    remote = [t for t in names if t not in ("local", "localhost")]
    by_name = {}
    if remote:
        from agent import fleet  # paramiko costs ~150 ms and ~18 MB: only for remote hosts

        done, stop = fleet.progress_printer(len(remote))
        try:
            results = fleet.run(remote, fleet.FleetOptions(probe_options, ssh_config, accept_new, parallel, timeout), done)
        finally:
            stop()
        for r in results:
            for note in r.notes:
                sys.stderr.write("kvforensics: {}: {}\n".format(r.target, note))
            if r.snapshot is None:
                code, message = r.problem or ("ssh.error", "failed")
                sys.stderr.write("kvforensics: {}: {}\n".format(r.status, message))
                by_name.setdefault(r.target, []).append(("ssh:" + r.target, None,
                                                         TargetFailure("ssh:" + r.target, r.status, code, message)))
            else:
                by_name.setdefault(r.target, []).append(("ssh:" + r.target, r.snapshot, None))
    entries = []
    for name in names:
        if name in ("local", "localhost"):
            snap = snapshot.collect(**probe_options)
            entries.append(("local:{}".format(snap.get("hostname")), snap, None))
        else:
            entries.append(by_name[name].pop(0))
    return entries


@app.command(short_help="Sample into history; export Prometheus metrics (cron).")
def record(
    db: Optional[str] = typer.Option(None, "--db", help="History database (default $KVFORENSICS_DB, /var/lib/kvforensics/history.db as root, else ~/.local/state/kvforensics/history.db)."),
    prom_file: Optional[str] = typer.Option(None, "--prom-file", help="Write a Prometheus textfile here (atomically), for node_exporter's textfile collector."),
    samples: int = typer.Option(1, "--samples", help="Snapshots to take in this run."),
    interval: float = typer.Option(10.0, "--interval", help="Seconds between snapshots."),
    keep: Optional[str] = typer.Option("30d", "--keep", help="Delete samples older than this (30d, 12h, 2w); 'forever' keeps all."),
    margin: float = typer.Option(2.0, "--margin", help="GiB to keep free for runtime activations when sizing recommendations."),
    request_tokens: int = typer.Option(8192, "--request-tokens", help="Tokens per request for concurrency estimates."),
    nvml_lib: Optional[str] = typer.Option(None, "--nvml-lib", help="Load libnvidia-ml.so.1 from this path."),
    log: Optional[str] = typer.Option(None, "--log", help="The engine's log: PATH, journal:UNIT or docker:NAME."),
    model_config: Optional[str] = typer.Option(None, "--model-config", help="config.json or model directory."),
    http: bool = typer.Option(True, "--http/--no-http", help="Ask the engine's loopback HTTP API for live metrics."),
    engine: Optional[int] = typer.Option(None, "--engine", help="Port of the SGLang server to record when a node runs several."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success (for cron)."),
) -> None:
    """Sample this node into the history (low-water marks) and export Prometheus metrics. For cron/systemd."""
    from agent import history
    from agent import record as record_mod
    from collectors import snapshot
    from reports import prometheus

    if samples < 1 or interval < 0:
        raise UsageProblem("--samples must be >= 1 and --interval >= 0")
    keep_s = None
    if keep and keep != "forever":
        try:
            keep_s = history.parse_duration(keep)
        except ValueError as exc:
            raise UsageProblem("--keep: {}".format(exc)) from None
    _check_log_spec(log)
    path = db or history.default_path()
    opts = _options(margin, request_tokens)

    def collect():
        return snapshot.collect(nvml_lib=nvml_lib, log=log, model_config_path=model_config, http=http, engine=engine)

    try:
        with history.Lock(path):
            result = record_mod.record(path, collect, opts, samples, interval, keep_s,
                                       target="local:{}".format(__import__("socket").gethostname()))
    except history.Busy as exc:
        sys.stderr.write("kvforensics: {}\n".format(exc))
        return
    except history.HistoryError as exc:
        raise UsageProblem(str(exc)) from None
    if result.moved_aside:
        sys.stderr.write("kvforensics: the history file was not usable and was moved aside to {}; started a new "
                         "one at {}\n".format(result.moved_aside, path))
    if prom_file:
        lows = {lw.gpu: lw for lw in result.stats.gpus}
        try:
            prometheus.write(prom_file, prometheus.registry(result.inspection, lows, result.stats.samples, opts.margin_bytes))
        except OSError as exc:
            raise UsageProblem("--prom-file {}: {}".format(prom_file, exc.strerror or exc)) from None
    if not quiet:
        st = result.stats
        low = min((lw.min_free_bytes for lw in st.gpus if lw.min_free_bytes is not None and lw.rank), default=None)
        sys.stdout.write("recorded {} sample(s) into {} (run {}: {} samples{}){}{}\n".format(
            result.samples_written, path, st.run_key, st.samples,
            ", lowest free {:.2f} GiB".format(low / (1 << 30)) if low is not None else "",
            "; pruned {}".format(result.pruned) if result.pruned else "",
            "; wrote {}".format(prom_file) if prom_file else ""))
    if result.inspection.collected_nothing:
        raise typer.Exit(exitcodes.EXIT_COLLECTION_FAILED)


@app.command("history", short_help="Low-water free memory and peak KV use over time.")
def history_cmd(
    db: Optional[str] = typer.Option(None, "--db", help="History database (default as for record)."),
    since: str = typer.Option("7d", "--since", help="Window: 7d, 12h, 90m, 2w."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (schema kvforensics.history/1)."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Force colour on or off."),
) -> None:
    """Show recorded history: per GPU and rank the low-water free memory, peak KV usage, a plot."""
    import json
    import time

    from agent import history
    from reports import history_report

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
        start = time.time() - window
        runs = [history.run_stats(opened.conn, rid, since=start) for rid in history.runs(opened.conn, since=start)]
        plots = {}
        for r in runs:
            for lw in r.gpus:
                plots.setdefault(lw.gpu, [v for _, v in history.series(opened.conn, lw.gpu, since=start)])
    finally:
        opened.conn.close()
    if as_json:
        sys.stdout.write(json.dumps(history_report.to_json(path, since, runs), indent=2) + "\n")
    else:
        width = max(80, shutil.get_terminal_size((120, 24)).columns)
        sys.stdout.write(history_report.render(path, since, runs, plots, color=_use_color(color), width=width))


@app.command(short_help="Live view of free GPU memory and KV usage.")
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
        watch_mod.run(interval, count, nvml_lib, http, color=_use_color(color))
    except KeyboardInterrupt:
        sys.stderr.write("\n")


@app.command(short_help="Write the exact probe shipped to inspected hosts.")
def probe(
    output: str = typer.Option(..., "--output", "-o", help="Where to write the probe script."),
) -> None:
    """Write the probe script that `inspect HOST` sends on stdin to `python3 -I -`, for review or a manual run."""
    from agent import probe as probe_mod

    try:
        sha, size = probe_mod.write(output)
    except OSError as exc:
        raise UsageProblem("--output {}: {}".format(output, exc.strerror or exc)) from None
    sys.stdout.write("wrote {} ({:,} bytes; code sha256 {}); run it by hand with: python3 -I - < {}\n".format(
        output, size, sha, output))


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: run the app, map every outcome to a documented exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name="kvforensics", standalone_mode=False)
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
            sys.stderr.write("kvforensics: error: {}\n".format(exc.format_message()))
            return exitcodes.EXIT_USAGE
        if os.environ.get("KVFORENSICS_DEBUG"):
            raise
        sys.stderr.write("kvforensics: internal error: {}: {} (rerun with KVFORENSICS_DEBUG=1 for a "
                         "traceback, and please report it)\n".format(type(exc).__name__, exc))
        return exitcodes.EXIT_INTERNAL


def entry() -> None:
    sys.exit(main())
