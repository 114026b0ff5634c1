"""``kvforensics record``: sample this node into the history and export Prometheus metrics (cron)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Callable, Dict, List, Optional

import kvforensics.agent.cli.exitcodes as exitcodes
from kvforensics.agent.cli.options import (
    GONE_AFTER,
    KEEP,
    MARGIN_GIB,
    REQUEST_TOKENS,
    Db,
    EngineFilter,
    GoneAfter,
    Http,
    Keep,
    Log,
    Margin,
    ModelConfig,
    NodeSeriesOption,
    NvmlLibHere,
    RequestTokens,
    UsageProblem,
    analysis_options,
    check_log_spec,
)
from kvforensics.agent.cli.params import ExitStatus, Option

if TYPE_CHECKING:
    from kvforensics.agent.history.record import RecordResult


def record(
    db: Db = None,
    prom_file: Annotated[Optional[str], Option("--prom-file",
                                               help="Write a Prometheus textfile here (atomically), for "
                                                    "node_exporter's textfile collector.")] = None,
    create_textfile_dir: Annotated[bool, Option("--create-textfile-dir",
                                                help="Create --prom-file's directory when it is missing "
                                                     "(by default a missing one is an error: node_exporter "
                                                     "reads its own directory, and a new one nothing "
                                                     "reads).")] = False,
    samples: Annotated[int, Option("--samples", help="Snapshots to take in this run.")] = 1,
    interval: Annotated[float, Option("--interval", help="Seconds between snapshots.")] = 10.0,
    keep: Keep = KEEP,
    margin: Margin = MARGIN_GIB,
    request_tokens: RequestTokens = REQUEST_TOKENS,
    nvml_lib: NvmlLibHere = None,
    log: Log = None,
    model_config: ModelConfig = None,
    http: Http = True,
    engine: EngineFilter = None,
    node_series: NodeSeriesOption = None,
    gone_after: GoneAfter = GONE_AFTER,
    quiet: Annotated[bool, Option("--quiet", "-q", help="Print nothing on success (for cron).")] = False,
) -> None:
    """Sample this node into the history (low-water marks) and export Prometheus metrics. For cron/systemd.
    Every engine on the node is recorded (--engine: those it names)."""
    from kvforensics.agent.history import record as record_mod
    from kvforensics.agent.history import store as history
    from kvforensics.reports import textfile

    if not 1 <= samples <= 10000 or not 0 <= interval <= 86400:  # also NaN and infinity
        raise UsageProblem("--samples must be 1–10000 and --interval 0–86400 seconds")
    keep_s = keep_seconds(keep)
    gone_s = gone_seconds(gone_after, keep_s)
    check_log_spec(log)
    if prom_file:
        _check_folder(prom_file, create_textfile_dir)  # before sampling: a cron run of 100 s ends in one line
        _claim_textfile(prom_file)
    path = db or history.default_path()
    opts = analysis_options(margin, request_tokens)

    collect = collector(nvml_lib, log, model_config, http, engine)
    try:
        history.claim(path)  # a path that is not our history is refused before the lock is made beside it
        with history.Lock(path):
            result = record_mod.record(path, collect, opts, samples, interval, keep_s, target=local_target(),
                                       engine=engine, gone_after_s=gone_s)
    except history.Busy as exc:
        sys.stderr.write("kvforensics: {}\n".format(exc))
        return
    except history.HistoryError as exc:
        raise UsageProblem(str(exc)) from None
    if result.moved_aside:
        sys.stderr.write("kvforensics: the history file was not usable and was moved aside to {}; started a new "
                         "one at {}\n".format(result.moved_aside, path))
    if prom_file:
        try:
            if create_textfile_dir:
                _ensure_folder(prom_file)
            textfile.write(prom_file, metrics_registry(result, node_series_for(node_series, engine)))
        except (textfile.Refused, OSError) as exc:
            raise _textfile_problem(prom_file, exc) from None
    _report(result, path, prom_file, quiet)


def _report(result: "RecordResult", path: str, prom_file: Optional[str], quiet: bool) -> None:
    """The run in one line on stdout (unless --quiet); what could not be collected in one line on stderr, even
    with --quiet (cron mails it), and exit 3 (README "Exit codes"): nothing at all, or no GPU (record keeps
    GPU memory history, so a run without NVML did not do its job)."""
    if result.collected_nothing:
        why = "; ".join(p.message for p in result.inspection.problems[:3]) or "no GPU, no engine, no host memory"
        sys.stderr.write("kvforensics: record collected nothing on this node ({}); the sample says so and "
                         "last_success is not updated\n".format(why))
        raise ExitStatus(exitcodes.EXIT_COLLECTION_FAILED)
    if not quiet:
        _say_runs(result, path, prom_file)
    nvml = result.inspection.snapshot.nvml
    if nvml.unavailable or not result.inspection.gpus:
        why = "; ".join(p.message for p in nvml.problems) or "NVML reports no GPU"
        sys.stderr.write("kvforensics: record sampled no GPU ({}): the samples hold host memory and engine "
                         "processes only\n".format(why))
        raise ExitStatus(exitcodes.EXIT_COLLECTION_FAILED)


def _say_runs(result: "RecordResult", path: str, prom_file: Optional[str]) -> None:
    runs = []
    for e in result.engines:
        st = e.stats
        low = min((lw.min_free_bytes for lw in st.gpus if lw.min_free_bytes is not None and lw.rank), default=None)
        runs.append("{}run {}: {} samples{}".format(
            e.inspection.engine + " " if e.inspection.engine else "", st.run_key, st.samples,
            ", lowest free {:.2f} GiB".format(low / (1 << 30)) if low is not None else ""))
    sys.stdout.write("recorded {} sample(s) into {} ({}){}{}{}\n".format(
        result.samples_written, path, "; ".join(runs),
        "; gone: {}".format(", ".join(r.engine for r in result.gone)) if result.gone else "",
        "; pruned {}".format(result.pruned) if result.pruned else "",
        "; wrote {}".format(prom_file) if prom_file else ""))


def keep_seconds(keep: Optional[str]) -> Optional[float]:
    """--keep, checked: seconds, or None for 'forever' (and an empty value)."""
    from kvforensics.agent.history import store as history

    if not keep or keep == "forever":
        return None
    try:
        return history.parse_duration(keep)
    except ValueError as exc:
        raise UsageProblem("--keep: {}".format(exc)) from None


def gone_seconds(gone_after: str, keep_s: Optional[float]) -> float:
    """--gone-after, checked: seconds, no longer than --keep (the history forgets a run then)."""
    from kvforensics.agent.history import store as history

    try:
        gone_s = history.parse_duration(gone_after)
    except ValueError as exc:
        raise UsageProblem("--gone-after: {}".format(exc)) from None
    if keep_s is not None and gone_s > keep_s:
        raise UsageProblem("--gone-after {} is longer than --keep: the history forgets an engine's runs "
                           "sooner".format(gone_after))
    return gone_s


def local_target() -> str:
    import socket

    return "local:{}".format(socket.gethostname())


def collector(nvml_lib: Optional[str], log: Optional[str], model_config: Optional[str], http: bool,
              engine: Optional[str]) -> Callable[[], List[Dict[str, Any]]]:
    """One look at this node per call: a snapshot per engine (--engine: that one), with the collection
    options of record and serve (made here: typed without a schema check, evidence.Collected)."""
    from kvforensics.agent.model.evidence import Collected
    from kvforensics.collectors import snapshot

    def collect() -> List[Dict[str, Any]]:
        return [Collected(snap) for snap in snapshot.collect_each(nvml_lib=nvml_lib, log=log,
                                                                  model_config_path=model_config, http=http,
                                                                  engine=engine)]

    return collect


def node_series_for(flag: Optional[bool], engine: Optional[str]) -> bool:
    """The node's own series are written unless --engine restricts this writer to one engine (a node
    whose engines are recorded apart has one writer of the node's series: --node-series there)."""
    return flag if flag is not None else engine is None


def metrics_registry(result: "RecordResult", node: bool = True):  # type: ignore[no-untyped-def]
    """The Prometheus registry of one record result: the textfile's and serve's, so both export the same
    series with the same values for the same node."""
    from kvforensics.reports import prometheus

    engines = tuple(prometheus.EngineSeries(inspection=e.inspection, low_water={lw.gpu: lw for lw in e.stats.gpus},
                                            run_min=e.run_min, samples=e.stats.samples) for e in result.engines)
    gone = tuple((("engine", r.engine),) + r.pod for r in result.gone)
    return prometheus.registry(prometheus.NodeSeries(engines=engines, gone=gone, last_success=result.last_success,
                                                     node=node))


def _check_folder(path: str, create: bool) -> None:
    """A missing textfile directory is refused unless --create-textfile-dir: node_exporter packages read
    different directories, and one created where none reads would hide every metric without an error."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not create and not os.path.isdir(folder):
        raise UsageProblem("--prom-file {}: the directory {} does not exist; node_exporter reads the one in its "
                           "--collector.textfile.directory (kvforensics deploy-files finds it), or pass "
                           "--create-textfile-dir to create this one".format(path, folder))


def _claim_textfile(path: str) -> None:
    """Only our own textfile is replaced (reports/textfile.py): anything else at --prom-file is refused before
    sampling, exit 2, untouched."""
    from kvforensics.reports import textfile

    try:
        textfile.claim(path)
    except (textfile.Refused, OSError) as exc:
        raise _textfile_problem(path, exc) from None


def _textfile_problem(path: str, exc: Exception) -> UsageProblem:
    """--prom-file's one line: a refusal says the path itself; an OSError is the system's words."""
    from kvforensics.reports import textfile

    if isinstance(exc, textfile.Refused):
        return UsageProblem("--prom-file {}".format(exc))
    return UsageProblem("--prom-file {}: {}".format(path, getattr(exc, "strerror", None) or exc))


def _ensure_folder(path: str) -> None:
    """--create-textfile-dir: create the textfile directory, readable by node_exporter."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o755, exist_ok=True)
