"""``kvforensics serve``: an HTTP endpoint for Prometheus that samples this node on scrape (DaemonSet, service)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Annotated

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
from kvforensics.agent.cli.params import Option

DEFAULT_LISTEN = "127.0.0.1:9842"
MAX_INTERVAL_S = 86400.0


def serve(
    listen: Annotated[str, Option("--listen", help="ADDR:PORT to listen on; every interface only when written "
                                                   "out (0.0.0.0:9842, [::]:9842). A socket passed by systemd "
                                                   "socket activation takes its place.")] = DEFAULT_LISTEN,
    min_interval: Annotated[str, Option("--min-interval",
                                        help="Sample at most this often (15s, 1m, or seconds; 0 samples on "
                                             "every scrape); scrapes in between get the last sample.")] = "15s",
    db: Db = None,
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
) -> None:
    """Serve /metrics (the metrics record writes, sampled on scrape into the same history) and /healthz."""
    from kvforensics.agent.cli import record as record_cli
    from kvforensics.agent.cli import serve_http
    from kvforensics.agent.history import serve as serving
    from kvforensics.agent.history import store as history

    interval_s = _interval(min_interval)
    keep_s = record_cli.keep_seconds(keep)
    gone_s = record_cli.gone_seconds(gone_after, keep_s)
    check_log_spec(log)
    opts = analysis_options(margin, request_tokens)
    path = db or history.default_path()
    collect = record_cli.collector(nvml_lib, log, model_config, http, engine)
    target = record_cli.local_target()
    node = record_cli.node_series_for(node_series, engine)

    def take() -> serving.Look:
        result = serving.record_one(path, collect, opts, keep_s, target, engine, gone_s)
        if result.moved_aside:
            sys.stderr.write("kvforensics serve: the history file was not usable and was moved aside to {}; started "
                             "a new one at {}\n".format(result.moved_aside, path))
        return serving.Look(record_cli.metrics_registry(result, node), not result.collected_nothing)

    sampler = serving.Sampler(take, interval_s)
    window = serving.health_window(interval_s)
    try:
        server = serve_http.make_server(listen, serve_http.Endpoint(sampler, window))
    except serve_http.ListenError as exc:
        raise UsageProblem(str(exc)) from None
    sys.stderr.write("kvforensics serve: listening on {url} (/metrics, /healthz); history {db}; a sample at most "
                     "every {iv:g} s; /healthz is 503 when no sample succeeded in the last {w:g} s\n".format(
                         url=serve_http.url(server), db=path, iv=interval_s, w=window))
    _run(server, sampler)


def _interval(text: str) -> float:
    """--min-interval: a duration (15s, 1m) or plain seconds, 0 included."""
    from kvforensics.agent.history import store as history

    try:
        value = float(text)
    except ValueError:
        try:
            value = history.parse_duration(text)
        except ValueError as exc:
            raise UsageProblem("--min-interval: {}".format(exc)) from None
    if not 0 <= value <= MAX_INTERVAL_S:  # also NaN and infinity
        raise UsageProblem("--min-interval must be 0–86400 seconds, not {}".format(text))
    return value


def _run(server, sampler) -> None:  # type: ignore[no-untyped-def]
    """Serve until SIGTERM (exit 0: kubelet and systemd stop this way) or Ctrl-C (exit 130). Either way the
    socket closes first, a sample being written finishes, and no new one starts."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    worker = threading.Thread(target=server.serve_forever, name="kvforensics-serve", daemon=True)
    worker.start()
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        sampler.close()
        signal.signal(signal.SIGTERM, previous)
    sys.stderr.write("kvforensics serve: stopped\n")
