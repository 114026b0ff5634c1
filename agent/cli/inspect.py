"""``kvforensics inspect [HOST...]``: inspect nodes live (here or over SSH), reconciled."""

from __future__ import annotations

import sys
from typing import Annotated, List, Optional

import typer

from agent import exitcodes
from agent.cli.options import (
    FAIL_ON,
    MARGIN_GIB,
    REQUEST_TOKENS,
    Color,
    FailOn,
    Http,
    InspectDb,
    InspectEngine,
    InspectLog,
    InspectModelConfig,
    InspectNvmlLib,
    InspectStartup,
    Margin,
    ReportJson,
    RequestTokens,
    UsageProblem,
    analysis_options,
    check_log_spec,
    exit_for_findings,
    fail_level,
    terminal_width,
    use_color,
)


def inspect(
    targets: Annotated[Optional[List[str]], typer.Argument(help="Hosts: user@host[:port] or ssh config aliases; none or 'local' = this machine.", show_default=False)] = None,
    hosts_file: Annotated[Optional[str], typer.Option("--hosts-file", help="Read targets from a file: one per line, '#' comments.")] = None,
    as_json: ReportJson = False,
    detail: Annotated[bool, typer.Option("--detail", help="With several hosts, print each host's full report after the summary.")] = False,
    fail_on: FailOn = FAIL_ON,
    margin: Margin = MARGIN_GIB,
    request_tokens: RequestTokens = REQUEST_TOKENS,
    nvml_lib: InspectNvmlLib = None,
    log: InspectLog = None,
    startup: InspectStartup = -1,
    model_config: InspectModelConfig = None,
    save: Annotated[Optional[str], typer.Option("--save", help="Also write everything collected to this JSON evidence bundle (one target).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Analyse an evidence bundle written by --save instead of a host.")] = None,
    http: Http = True,
    ssh_config: Annotated[Optional[str], typer.Option("--ssh-config", help="OpenSSH client config to use (default ~/.ssh/config).")] = None,
    accept_new_host_keys: Annotated[bool, typer.Option("--accept-new-host-keys", help="Record unknown hosts' keys (like StrictHostKeyChecking accept-new); changed keys are always refused.")] = False,
    parallel: Annotated[int, typer.Option("--parallel", help="Hosts inspected at once.")] = 16,
    db: InspectDb = None,
    engine: InspectEngine = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Deadline per host, in seconds (connect, authenticate, probe).")] = 30.0,
    color: Color = None,
) -> None:
    """Inspect nodes live: NVML, host RAM, engine processes and their logs, reconciled (local or over SSH)."""
    from agent import bundles
    from agent.reconcile import inspect_snapshot
    from reports import json_report

    level = fail_level(fail_on)
    opts = analysis_options(margin, request_tokens)
    if parallel < 1 or timeout <= 0:
        raise UsageProblem("--parallel must be >= 1 and --timeout > 0")
    if startup == 0:
        raise UsageProblem("--startup counts from 1 (first) or from -1 (last); 0 is neither")
    check_log_spec(log)
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
    inspections = [r for r in results if not isinstance(r, tuple)]
    failures = [r for r in results if isinstance(r, tuple)]
    if as_json:
        sys.stdout.write(json_report.render_results(results))
    else:
        from reports import terminal

        width = terminal_width()
        if len(results) > 1:
            sys.stdout.write(terminal.render_fleet(results, color=use_color(color), width=width))
        if inspections and (detail or len(results) == 1):
            sys.stdout.write(terminal.render_inspections(inspections, color=use_color(color), width=width))
    empty = [i.target for i in inspections if i.collected_nothing]
    if empty:
        sys.stderr.write("kvforensics: nothing could be collected from {}\n".format(", ".join(empty)))
    if failures or empty:
        raise typer.Exit(exitcodes.EXIT_COLLECTION_FAILED)
    exit_for_findings(level, [f for i in inspections for f in i.findings])


def _collect_targets(names: List[str], probe_options: dict, ssh_config: Optional[str], accept_new: bool,
                     parallel: int, timeout: float) -> List[tuple]:
    """(target, snapshot, None) or (target, None, (target, status, code, message)) per name, in order."""
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
                by_name.setdefault(r.target, []).append(("ssh:" + r.target, None, ("ssh:" + r.target, r.status, code, message)))
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
