"""``kvforensics record``: sample this node into the history and export Prometheus metrics (cron)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Callable, Dict, Optional

import typer

import agent.cli.exitcodes as exitcodes
from agent.cli.options import (
    MARGIN_GIB,
    REQUEST_TOKENS,
    Db,
    Engine,
    Http,
    Log,
    Margin,
    ModelConfig,
    NvmlLib,
    RequestTokens,
    UsageProblem,
    analysis_options,
    check_log_spec,
)

if TYPE_CHECKING:
    from agent.history.record import RecordResult


def record(
    db: Db = None,
    prom_file: Annotated[Optional[str], typer.Option("--prom-file",
                                                     help="Write a Prometheus textfile here (atomically), for "
                                                          "node_exporter's textfile collector.")] = None,
    samples: Annotated[int, typer.Option("--samples", help="Snapshots to take in this run.")] = 1,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between snapshots.")] = 10.0,
    keep: Annotated[Optional[str], typer.Option("--keep",
                                                help="Delete samples older than this (30d, 12h, 2w); 'forever' keeps "
                                                     "all.")] = "30d",
    margin: Margin = MARGIN_GIB,
    request_tokens: RequestTokens = REQUEST_TOKENS,
    nvml_lib: NvmlLib = None,
    log: Log = None,
    model_config: ModelConfig = None,
    http: Http = True,
    engine: Engine = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success (for cron).")] = False,
) -> None:
    """Sample this node into the history (low-water marks) and export Prometheus metrics. For cron/systemd."""
    from agent.history import record as record_mod
    from agent.history import store as history
    from reports import prometheus

    if not 1 <= samples <= 10000 or not 0 <= interval <= 86400:  # also NaN and infinity
        raise UsageProblem("--samples must be 1–10000 and --interval 0–86400 seconds")
    keep_s = keep_seconds(keep)
    check_log_spec(log)
    path = db or history.default_path()
    opts = analysis_options(margin, request_tokens)

    collect = collector(nvml_lib, log, model_config, http, engine)
    try:
        history.claim(path)  # a path that is not our history is refused before the lock is made beside it
        with history.Lock(path):
            result = record_mod.record(path, collect, opts, samples, interval, keep_s, target=local_target())
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
            _ensure_folder(prom_file)
            prometheus.write(prom_file, metrics_registry(result))
        except OSError as exc:
            raise UsageProblem("--prom-file {}: {}".format(prom_file, exc.strerror or exc)) from None
    _say_outcome(result, path, prom_file, quiet)


def _say_outcome(result, path: str, prom_file: Optional[str], quiet: bool) -> None:  # type: ignore[no-untyped-def]
    """The run in one line on stdout (unless --quiet); what could not be collected in one line on stderr, even
    with --quiet (cron mails it), and exit 3 (README "Exit codes"): nothing at all, or no GPU (record keeps
    GPU memory history, so a run without NVML did not do its job)."""
    insp = result.inspection
    if insp.collected_nothing:
        why = "; ".join(p.message for p in insp.problems[:3]) or "no GPU, no engine, no host memory"
        sys.stderr.write("kvforensics: record collected nothing on this node ({}); the sample says so and "
                         "last_success is not updated\n".format(why))
        raise typer.Exit(exitcodes.EXIT_COLLECTION_FAILED)
    if not quiet:
        st = result.stats
        low = min((lw.min_free_bytes for lw in st.gpus if lw.min_free_bytes is not None and lw.rank), default=None)
        sys.stdout.write("recorded {} sample(s) into {} (run {}: {} samples{}){}{}\n".format(
            result.samples_written, path, st.run_key, st.samples,
            ", lowest free {:.2f} GiB".format(low / (1 << 30)) if low is not None else "",
            "; pruned {}".format(result.pruned) if result.pruned else "",
            "; wrote {}".format(prom_file) if prom_file else ""))
    nvml = insp.snapshot.nvml
    if nvml.unavailable or not insp.gpus:
        why = "; ".join(p.message for p in nvml.problems) or "NVML reports no GPU"
        sys.stderr.write("kvforensics: record sampled no GPU ({}): the samples hold host memory and engine "
                         "processes only\n".format(why))
        raise typer.Exit(exitcodes.EXIT_COLLECTION_FAILED)


def keep_seconds(keep: Optional[str]) -> Optional[float]:
    """--keep, checked: seconds, or None for 'forever' (and an empty value)."""
    from agent.history import store as history

    if not keep or keep == "forever":
        return None
    try:
        return history.parse_duration(keep)
    except ValueError as exc:
        raise UsageProblem("--keep: {}".format(exc)) from None


def local_target() -> str:
    import socket

    return "local:{}".format(socket.gethostname())


def collector(nvml_lib: Optional[str], log: Optional[str], model_config: Optional[str], http: bool,
              engine: Optional[int]) -> Callable[[], Dict[str, Any]]:
    """One snapshot of this node per call, with the collection options of record and serve (made here: typed
    without a schema check, evidence.Collected)."""
    from agent.model.evidence import Collected
    from collectors import snapshot

    def collect() -> Dict[str, Any]:
        return Collected(snapshot.collect(nvml_lib=nvml_lib, log=log, model_config_path=model_config, http=http,
                                          engine=engine))

    return collect


def metrics_registry(result: "RecordResult"):  # type: ignore[no-untyped-def]
    """The Prometheus registry of one record result: the textfile's and serve's, so both export the same
    series with the same values for the same node."""
    from reports import prometheus

    lows = {lw.gpu: lw for lw in result.stats.gpus}
    return prometheus.registry(result.inspection, lows, result.stats.samples, result.run_min)


def _ensure_folder(path: str) -> None:
    """The textfile directory may not exist yet on a fresh node (node_exporter packages differ):
    create it, readable by node_exporter."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o755, exist_ok=True)
