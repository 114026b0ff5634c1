"""``kvforensics inspect [HOST...]``: inspect nodes live (here or over SSH), reconciled.

The command runs in five steps, each its own function: validate (options to checked
settings), collect (targets to snapshots or failures, in target order), analyse (snapshots to
inspections), render (JSON, or the terminal's fleet table and reports), and the exit code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Dict, List, Optional, Tuple

import kvforensics.agent.cli.exitcodes as exitcodes
from kvforensics.agent.cli.options import (
    FAIL_ON,
    MARGIN_GIB,
    REQUEST_TOKENS,
    Color,
    Db,
    DetailHosts,
    Engine,
    FailOn,
    Http,
    Log,
    Margin,
    ModelConfig,
    NvmlLib,
    ReportFormat,
    ReportJson,
    RequestTokens,
    Startup,
    UsageProblem,
    analysis_options,
    check_log_spec,
    fail_level,
    findings_exit_code,
    report_format,
    terminal_width,
    use_color,
)
from kvforensics.agent.cli.params import Argument, ExitStatus, Option

if TYPE_CHECKING:  # the model's records load after the first ssh has started (fleet.run's while_waiting)
    from kvforensics.agent.history.store import RunStats
    from kvforensics.agent.model.live import Inspection, TargetFailure, TargetResult
    from kvforensics.agent.model.records import Options
    from kvforensics.agent.remote.fleet import HostResult

LOCAL_NAMES = ("local", "localhost")

# One per target, in the order given: (target, snapshot, None) or (target, None, failure).
Entry = Tuple[str, Optional[Dict[str, Any]], Optional["TargetFailure"]]
# What each target ends as, in the order given.
Result = "TargetResult"
# Remote hosts analysed as they arrived, while the others were still being collected: by the snapshot's id,
# the snapshot kept with its result (so that id cannot name another object meanwhile).
Early = Dict[int, Tuple[Dict[str, Any], "TargetResult"]]


def inspect(
    targets: Annotated[Optional[List[str]],
                       Argument(help="Hosts: user@host[:port] or ssh config aliases; pods: "
                                     "k8s:NAMESPACE/POD[/CONTAINER] (through kubectl); none or 'local' = "
                                     "this machine.",
                                show_default=False)] = None,
    hosts_file: Annotated[Optional[str], Option("--hosts-file",
                                                help="Read targets from a file: one per line, '#' "
                                                     "comments.")] = None,
    fmt: ReportFormat = None,
    as_json: ReportJson = False,
    detail: DetailHosts = False,
    fail_on: FailOn = FAIL_ON,
    margin: Margin = MARGIN_GIB,
    request_tokens: RequestTokens = REQUEST_TOKENS,
    nvml_lib: NvmlLib = None,
    log: Log = None,
    startup: Startup = -1,
    model_config: ModelConfig = None,
    save: Annotated[Optional[str], Option("--save",
                                          help="Also write everything collected to this JSON evidence bundle "
                                               "(one target).")] = None,
    from_file: Annotated[Optional[str], Option("--from",
                                               help="Analyse an evidence bundle written by --save, or the "
                                                    "probe's own output (KVF-PROBE …), instead of a "
                                                    "host.")] = None,
    http: Http = True,
    ssh_config: Annotated[Optional[str], Option("--ssh-config",
                                                help="OpenSSH client config to use (default "
                                                     "~/.ssh/config).")] = None,
    accept_new_host_keys: Annotated[bool, Option("--accept-new-host-keys",
                                                 help="Record unknown hosts' keys (like StrictHostKeyChecking "
                                                      "accept-new); changed keys are always refused.")] = False,
    parallel: Annotated[int, Option("--parallel", help="Hosts inspected at once.")] = 16,
    transport: Annotated[str, Option("--transport", metavar="auto|openssh|paramiko",
                                     help="How SSH hosts are reached: the system's OpenSSH client (auto: when one "
                                          "≥ 7.6 is on PATH, so whatever `ssh HOST` honours works), or paramiko "
                                          "(no ProxyCommand, no Match exec).")] = "auto",
    multiplex: Annotated[bool, Option("--multiplex/--no-multiplex",
                                      help="OpenSSH: share one master connection per host for a minute "
                                           "(ControlMaster), so the next look pays one round trip.")] = True,
    db: Db = None,
    engine: Engine = None,
    identity: Annotated[Optional[str], Option("--identity", "-i",
                                              help="A private key to try first for every host (like ssh "
                                                   "-i).")] = None,
    sort: Annotated[Optional[str], Option("--sort", help="Order the targets: unused (most unused memory "
                                                        "first), host, or status (failures first).")] = None,
    timeout: Annotated[float, Option("--timeout",
                                     help="Deadline per host, in seconds (connect, authenticate, "
                                          "probe): more than 0, at most 86400.")] = 30.0,
    color: Color = None,
    context: Annotated[Optional[str], Option("--context", metavar="CONTEXT",
                                             help="The kubeconfig context for k8s: targets (kubectl "
                                                  "--context).")] = None,
) -> None:
    """Inspect nodes live: NVML, host RAM, engine processes and their logs, reconciled (local or over SSH)."""
    settings = _validate(
        targets=targets, hosts_file=hosts_file, fmt=report_format(fmt, as_json), detail=detail, fail_on=fail_on,
        margin=margin, request_tokens=request_tokens, nvml_lib=nvml_lib, log=log, startup=startup,
        model_config=model_config, save=save, from_file=from_file, http=http, ssh_config=ssh_config,
        accept_new_host_keys=accept_new_host_keys, parallel=parallel, db=db, engine=engine, timeout=timeout,
        color=color, identity=identity, sort=sort, context=context, transport=transport, multiplex=multiplex)
    early: Early = {}
    entries = _collect(settings, early)
    results = _analyse(settings, entries, early)
    _render(settings, results)
    code = _exit_code(settings, results)
    if code != exitcodes.EXIT_OK:
        raise ExitStatus(code)


@dataclass(frozen=True)
class InspectSettings:
    """inspect's options, checked: what to inspect, how to collect it, how to report it."""

    names: Tuple[str, ...]  # hosts in the order given (arguments, then --hosts-file); none = this machine
    from_file: Optional[str]  # --from: a saved bundle instead of any host
    save: Optional[str]
    # What the probe collects, here or on each host.
    nvml_lib: Optional[str]
    log: Optional[str]
    startup: int
    model_config: Optional[str]
    http: bool
    engine: Optional[str]  # --engine: a port or NAMESPACE/POD[:PORT] (collectors/selection.py)
    # How remote hosts are reached.
    ssh_config: Optional[str]
    accept_new_host_keys: bool
    parallel: int
    timeout: float
    identity: Optional[str]
    context: Optional[str]  # kubectl's --context, for k8s: targets
    transport: str  # auto | openssh | paramiko (agent/remote/transport.py)
    multiplex: bool
    # How snapshots are analysed and reported.
    db: Optional[str]
    opts: Options
    level: Optional[int]
    fmt: str  # terminal | json | markdown
    detail: bool
    color: Optional[bool]
    sort: Optional[str]

    def probe_options(self) -> Dict[str, Any]:
        """The probe's keyword arguments: snapshot.collect's here, shipped as JSON to remote hosts."""
        return {"nvml_lib": self.nvml_lib, "log": self.log, "startup": self.startup,
                "model_config_path": self.model_config, "http": self.http, "engine": self.engine}


def _validate(*, targets: Optional[List[str]], hosts_file: Optional[str], fmt: str, detail: bool, fail_on: str,
              margin: float, request_tokens: int, nvml_lib: Optional[str], log: Optional[str], startup: int,
              model_config: Optional[str], save: Optional[str], from_file: Optional[str], http: bool,
              ssh_config: Optional[str], accept_new_host_keys: bool, parallel: int, db: Optional[str],
              engine: Optional[str], timeout: float, color: Optional[bool], identity: Optional[str],
              sort: Optional[str], context: Optional[str] = None, transport: str = "auto",
              multiplex: bool = True) -> InspectSettings:
    """The options, checked (the first problem found is the one reported, so the order is kept)."""
    level = fail_level(fail_on)
    opts = analysis_options(margin, request_tokens)
    if not 1 <= parallel <= 1024:
        raise UsageProblem("--parallel must be 1–1024, not {}".format(parallel))
    if not timeout_accepted(timeout):
        raise UsageProblem("--timeout must be more than 0 and at most 86400 seconds, not {:g}".format(timeout))
    if startup == 0:
        raise UsageProblem("--startup counts from 1 (first) or from -1 (last); 0 is neither")
    if transport not in ("auto", "openssh", "paramiko"):
        raise UsageProblem("--transport takes auto, openssh or paramiko, not {!r}".format(transport))
    if sort is not None and sort not in ("unused", "host", "status"):
        raise UsageProblem("--sort takes unused, host or status")
    if identity is not None and not os.path.isfile(os.path.expanduser(identity)):
        raise UsageProblem("--identity {}: no such key file".format(identity))
    check_log_spec(log)
    _check_context(context)
    names = _target_names(targets, hosts_file)
    if engine is not None and any(n.startswith("k8s:") for n in names) and _names_a_pod(engine):
        raise UsageProblem("--engine {} chooses among a node's pods; a k8s: target is one pod already (inside it no "
                           "pod names its processes): give the server's port".format(engine))
    if from_file is not None and names:
        raise UsageProblem("--from reads a bundle; do not also name hosts")
    if save is not None and len(names) > 1:
        raise UsageProblem("--save writes one bundle: name one target")
    return InspectSettings(
        names=tuple(names), from_file=from_file, save=save, nvml_lib=nvml_lib, log=log, startup=startup,
        model_config=model_config, http=http, engine=engine, ssh_config=ssh_config,
        accept_new_host_keys=accept_new_host_keys, parallel=parallel, timeout=timeout, identity=identity,
        context=context, transport=transport, multiplex=multiplex, db=db, opts=opts, level=level, fmt=fmt,
        detail=detail, color=color, sort=sort)


def timeout_accepted(timeout: float) -> bool:
    """--timeout's bounds (also NaN and infinity out; 0 is not "no deadline": a silent host would hang the run)."""
    return 0 < timeout <= 86400


def _target_names(targets: Optional[List[str]], hosts_file: Optional[str]) -> List[str]:
    """The hosts named as arguments, then those in --hosts-file, with host ranges expanded."""
    from kvforensics.agent.remote.targets import expand_targets, read_hosts_file, split_target

    names = list(targets or [])
    if hosts_file:
        try:
            names += read_hosts_file(hosts_file)
        except OSError as exc:
            raise UsageProblem("--hosts-file {}: {}".format(hosts_file, exc.strerror or exc)) from None
    try:
        expanded = expand_targets(names)
        for name in expanded:  # a typo'd port or pod name is the command line's fault: said before any is contacted
            if name.startswith("k8s:"):
                _check_pod(name)
            elif name not in LOCAL_NAMES:
                split_target(name)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    return expanded


def _names_a_pod(engine: str) -> bool:
    from kvforensics.collectors.selection import parse

    return parse(engine).pod is not None


def _check_pod(name: str) -> None:
    from kvforensics.agent.remote.kubectl import parse_target

    parse_target(name)  # ValueError: a usage problem


def _check_context(context: Optional[str]) -> None:
    if context is None:  # nothing to check: kubectl's module (and the probe it ships) is not loaded
        return
    from kvforensics.agent.remote.kubectl import check_context

    try:
        check_context(context)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def _collect(settings: InspectSettings, early: Early) -> List[Entry]:
    """One entry per target, in the order given: the --from bundle, or each host (none: this machine)."""
    if settings.from_file is not None:
        entries = [_load_bundle(settings.from_file)]
    else:
        entries = _collect_targets(list(settings.names) or ["local"], settings, early)
    if settings.save is not None:
        _save_bundle(settings.save, entries)
    return entries


def _load_bundle(path: str) -> Entry:
    from kvforensics.agent.remote import bundles

    try:
        return ("bundle:{}".format(path), bundles.load(path), None)
    except bundles.BundleError as exc:
        raise UsageProblem(str(exc)) from None


def _save_bundle(path: str, entries: List[Entry]) -> None:
    """--save: the first snapshot collected (validation allows one target), if any was."""
    from kvforensics.agent.remote import bundles

    snaps = [snap for _, snap, _ in entries if snap is not None]
    if snaps:
        try:
            bundles.save(snaps[0], path)
        except OSError as exc:
            raise UsageProblem("--save {}: {}".format(path, exc)) from None


def _collect_targets(names: List[str], settings: InspectSettings, early: Early) -> List[Entry]:
    """Remote hosts first, all at once over SSH; then this machine where it is named; entries in the order named."""
    remote = [t for t in names if t not in LOCAL_NAMES and not t.startswith("k8s:")]
    pods = [t for t in names if t.startswith("k8s:")]
    by_name = _collect_remote(remote, settings, early) if remote else {}
    by_name.update(_collect_pods(pods, settings) if pods else {})
    entries = []
    for name in names:
        if name in LOCAL_NAMES:
            from kvforensics.agent.model.evidence import Collected
            from kvforensics.collectors import snapshot

            # this process's own collectors: typed without the schema check (evidence.Collected, as record does)
            snap = Collected(snapshot.collect(**settings.probe_options()))
            entries.append(("local:{}".format(snap.get("hostname")), snap, None))
        else:
            entries.append(by_name[name].pop(0))  # a host named twice was inspected twice: take them in turn
    return entries


def _collect_remote(remote: List[str], settings: InspectSettings, early: Early) -> Dict[str, List[Entry]]:
    """Each remote host's entries (one per time it is named), with a progress bar on a terminal. Each
    snapshot is analysed as it arrives (into ``early``): the client's CPU works while the other hosts run
    their probes, instead of analysing every host in one serial tail after the last one answered."""
    # the transport's module only for remote hosts (paramiko: ~150 ms, ~18 MB)
    from kvforensics.agent.remote import fleet

    fleet_options = fleet.FleetOptions(settings.probe_options(), settings.ssh_config, settings.accept_new_host_keys,
                                       settings.parallel, settings.timeout, settings.identity, settings.transport,
                                       settings.multiplex)
    from kvforensics.agent.remote.outcome import SshError

    progress, stop = fleet.progress_printer(len(remote))

    def done(r: HostResult) -> None:
        progress(r)
        if r.snapshot is not None:
            early[id(r.snapshot)] = (r.snapshot, _analyse_one(settings, "ssh:" + r.target, r.snapshot))

    try:
        results = fleet.run(remote, fleet_options, done, while_waiting=lambda: _warm_up(settings.fmt))
    except SshError as exc:  # the ssh config itself is refused (Match exec): nothing was contacted
        raise UsageProblem(exc.message) from None
    finally:
        stop()
    by_name: Dict[str, List[Entry]] = {}
    for r in results:
        by_name.setdefault(r.target, []).append(_remote_entry(r))
    return by_name


def _collect_pods(pods: List[str], settings: InspectSettings) -> Dict[str, List[Entry]]:
    """Each pod's entries (one per time it is named), through kubectl exec and kubectl logs."""
    from kvforensics.agent.model.live import TargetFailure
    from kvforensics.agent.remote import kubectl

    by_name: Dict[str, List[Entry]] = {}
    for r in kubectl.run(pods, settings.context, settings.probe_options(), settings.timeout, settings.parallel):
        failure = None
        if r.snapshot is None:
            code, message = r.problem or ("kubectl.failed", "failed")
            failure = TargetFailure(r.target, r.status, code, message)
        by_name.setdefault(r.target, []).append((r.target, r.snapshot, failure))
    return by_name


def _remote_entry(r: HostResult) -> Entry:
    """A host's result as an entry; its notes (a recorded host key, a skipped key) go to stderr."""
    from kvforensics.agent.model.live import TargetFailure

    for note in r.notes:
        sys.stderr.write("kvforensics: {}: {}\n".format(r.target, note))
    target = "ssh:" + r.target
    if r.snapshot is None:  # said when rendering: in the JSON or the oneline row, else on stderr
        code, message = r.problem or ("ssh.error", "failed")
        return (target, None, TargetFailure(target, r.status, code, message))
    return (target, r.snapshot, None)


def _analyse(settings: InspectSettings, entries: List[Entry], early: Early) -> List[Result]:
    """Each snapshot reconciled into an Inspection; failures pass through; target order kept."""
    results: List[Result] = []
    for target, snap, failure in entries:
        if snap is None:
            results.append(failure)  # type: ignore[arg-type]
        else:
            kept = early.get(id(snap))
            results.append(kept[1] if kept is not None and kept[0] is snap else _analyse_one(settings, target, snap))
    return results


def _warm_up(fmt: str) -> None:
    """Import what analysing and reporting a host need while its ssh handshake runs (fleet.run calls it once the
    first ssh has started, so it never delays one; the threads waiting on ssh hold no GIL): the first answer is
    then analysed at once, not after ~0.1 s of imports."""
    import importlib

    from kvforensics.agent.model import evidence
    from kvforensics.agent.plugin import ENGINES

    evidence._validator("snapshot")  # built on first use (the schema read, its validator made): now
    for name in ("kvforensics.agent.model.reconcile", "kvforensics.agent.model.rulebook",
                 "kvforensics.agent.model.verdict",
                 "kvforensics.reports.json_report" if fmt == "json" else "kvforensics.reports.terminal"):
        importlib.import_module(name)
    for engine in ENGINES.all():  # every engine's analysis: which one a host runs is not known yet
        getattr(engine.build_analysis, "where", None) and importlib.import_module(
            engine.build_analysis.where.split(":")[0])


def _analyse_one(settings: InspectSettings, target: str, snap: Dict[str, Any]) -> Result:
    """One target's inspection. A remote host's snapshot that breaks the schema, or breaks the
    analysis, costs that host alone: it becomes an ``error`` target and the others stand."""
    from kvforensics.agent.model.evidence import EvidenceError
    from kvforensics.agent.model.live import TargetFailure
    from kvforensics.agent.model.reconcile import inspect_snapshot

    try:
        snap, recorded = _local_history(settings, target, snap)
        return inspect_snapshot(snap, target, settings.opts, history=recorded)
    except EvidenceError as exc:
        return TargetFailure(target, "error", "snapshot.invalid", "the snapshot is not valid: {}".format(exc))
    except Exception as exc:  # noqa: BLE001 — a lying host must not take the fleet run down
        if not target.startswith(("ssh:", "k8s:")):
            raise
        return TargetFailure(target, "error", "internal.analysis",
                             "analysing this host's snapshot failed: {}: {}".format(type(exc).__name__, exc))


def _local_history(settings: InspectSettings, target: str,
                   snap: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[RunStats]]:
    """On this machine, from `kvforensics record`'s history (if any; it only describes the machine it ran on):
    the startup its engine run's log no longer holds, as record kept it, and the run's recorded samples."""
    if not target.startswith("local:"):
        return snap, None
    from kvforensics.agent.history import store as history_mod
    from kvforensics.agent.history.record import local_history

    return local_history(settings.db or history_mod.default_path(), snap)


def _render(settings: InspectSettings, results: List[Result]) -> None:
    """JSON, or the fleet table (several targets) and the reports: one target's on one screen, or in
    full with --detail (several targets: each in full with --detail); then, on stderr, the targets
    that failed or gave nothing."""
    if settings.sort is not None:  # the terminal renderer's module: JSON without --sort does not load it
        from kvforensics.reports.terminal import sort_results

        results = sort_results(results, settings.sort)
    inspections = _inspections(results)
    shown = inspections if settings.detail or len(results) == 1 else []  # one host: its report, short or full
    if settings.fmt == "oneline":
        from kvforensics.reports.terminal import render_oneline

        sys.stdout.write(render_oneline(results))
    elif settings.fmt == "json":
        from kvforensics.reports import json_report

        sys.stdout.write(json_report.render_results(results))
    elif settings.fmt == "markdown":
        from kvforensics.reports import markdown

        if len(results) > 1:
            sys.stdout.write(markdown.render_fleet(results) + ("\n" if shown else ""))
        if shown:
            sys.stdout.write(markdown.render_inspections(shown, detail=settings.detail))
    else:
        from kvforensics.reports import terminal

        width = terminal_width()
        if len(results) > 1:
            sys.stdout.write(terminal.render_fleet(results, color=use_color(settings.color), width=width))
        if shown:
            sys.stdout.write(terminal.render_inspections(shown, color=use_color(settings.color), width=width,
                                                         detail=settings.detail))
    if settings.fmt in ("terminal", "markdown"):
        _say_failures(results, settings.detail)
    empty = _collected_nothing(inspections)
    if empty:
        sys.stderr.write("kvforensics: nothing could be collected from {}\n".format(", ".join(empty)))


def _say_failures(results: List[Result], detail: bool) -> None:
    """One line on stderr per target that could not be collected, said once (the fleet table gives its status
    only): at most 80 columns, with the one thing to do (reports/failures.py); the whole message with -v. JSON
    and oneline carry the whole message in their own rows."""
    from kvforensics.agent.model.live import TargetFailure
    from kvforensics.reports.failures import failure_line

    for r in results:
        if isinstance(r, TargetFailure):
            host = r.target.split(":", 1)[-1]
            if detail:
                sys.stderr.write("kvforensics: {}: {}: {}\n".format(host, r.status, " ".join(r.message.split())))
            else:
                sys.stderr.write(failure_line(host, r.status, r.code, r.message) + "\n")


def _exit_code(settings: InspectSettings, results: List[Result]) -> int:
    """3 when a target failed or gave nothing; else 1 for findings at --fail-on or above; else 0."""
    inspections = _inspections(results)
    if len(inspections) < len(results) or _collected_nothing(inspections):  # fewer: some target failed
        return exitcodes.EXIT_COLLECTION_FAILED
    return findings_exit_code(settings.level, [f for i in inspections for f in i.findings])


def _inspections(results: List[Result]) -> List[Inspection]:
    from kvforensics.agent.model.live import TargetFailure

    return [r for r in results if not isinstance(r, TargetFailure)]


def _collected_nothing(inspections: List[Inspection]) -> List[str]:
    return [i.target for i in inspections if i.collected_nothing]
