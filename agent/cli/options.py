"""What the commands share: the options several of them take, those options' checks, and how a
bad value is reported.

Each shared option is declared once here as an ``Annotated`` alias (name, type and help, one
wording for every command) and a command takes it as ``margin: Margin = MARGIN_GIB``.

Checks raise ``UsageProblem`` (exit 2 with one line, in ``main()``). Heavy modules are imported
inside the checks so ``--help`` stays fast.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Annotated, List, Optional

import kvforensics.agent.cli.exitcodes as exitcodes
from kvforensics.agent.cli.params import ExitStatus, Option

if TYPE_CHECKING:
    from kvforensics.agent.model.records import Options

SEVERITY_CHOICES = ("info", "warning", "error", "critical", "never")

# Defaults that must agree wherever the option is taken.
MARGIN_GIB = "2GiB"
MAX_MARGIN_GIB = 1024.0  # more than any GPU has
REQUEST_TOKENS = 8192
FAIL_ON = "warning"

# The analysis: analyze, inspect and record.
Margin = Annotated[str, Option("--margin", metavar="SIZE",
                               help="Memory to keep free for runtime activations when sizing recommendations: "
                                    "2GiB, 512MiB, 1.5 (GiB when no unit).")]
RequestTokens = Annotated[int, Option("--request-tokens",
                                      help="Tokens per request (prompt + output) for concurrency estimates.")]
ModelConfig = Annotated[Optional[str], Option("--model-config", metavar="PATH",
                                              help="config.json or the model directory, to compute bytes per "
                                                   "token from the architecture (default: the running server's "
                                                   "model folder, where it is one).")]
# analyze's: a log has no server to take the model from
ModelConfigLog = Annotated[Optional[str], Option("--model-config", metavar="PATH",
                                                 help="config.json or the model directory, to compute bytes per "
                                                      "token from the architecture.")]
Startup = Annotated[int, Option("--startup",
                                help="Which startup in the log: 1 = first, -1 = last, -2 = the one before.")]

# The report: analyze and inspect.
FORMATS = ("terminal", "json", "markdown", "oneline")
ReportFormat = Annotated[Optional[str], Option("--format", metavar="FORMAT",
                                               help="terminal (default), json (schema kvforensics.report/1), "
                                                    "markdown (for tickets and chat) or oneline (one "
                                                    "tab-separated line per target, for grep and sort).")]
ReportFormatLog = Annotated[Optional[str], Option("--format", metavar="FORMAT",
                                                  help="terminal (default), json (schema kvforensics.report/1), "
                                                       "markdown (for tickets and chat) or oneline (inspect's "
                                                       "header and one tab-separated line for the log, for grep "
                                                       "and sort).")]
ReportJson = Annotated[bool, Option("--json", help="Print the JSON report: the same as --format json.")]
FailOn = Annotated[str, Option("--fail-on",
                               help="Exit 1 when a finding is at least this severe: info, warning, error, "
                                    "critical, never.")]
Color = Annotated[Optional[bool], Option("--color/--no-color",
                                         help="Force colour on or off (default: on for a terminal).")]
DETAIL_HELP = ("The full report: the ledger per rank, sources, per-worker tables, bars, each finding in full, "
               "footnotes (default: the answer on one screen).")
Detail = Annotated[bool, Option("--detail", "-v", help=DETAIL_HELP)]
# inspect's: the same, and what it does to a fleet
DetailHosts = Annotated[bool, Option("--detail", "-v", help=DETAIL_HELP + " With several hosts: each host's "
                                                                          "full report after the summary.")]

# Collecting from a node: inspect, record and watch.
NvmlLib = Annotated[Optional[str], Option("--nvml-lib", metavar="PATH",
                                          help="Load the NVIDIA driver library (libnvidia-ml.so.1) from this "
                                               "path (on the inspected host).")]
# record, watch and serve run on the node itself
NvmlLibHere = Annotated[Optional[str], Option("--nvml-lib", metavar="PATH",
                                              help="Load the NVIDIA driver library (libnvidia-ml.so.1) from this "
                                                   "path (default: the system's).")]
Http = Annotated[bool, Option("--http/--no-http",
                              help="Ask the engine's loopback HTTP API for live metrics (KV usage, load).")]
Log = Annotated[Optional[str], Option("--log",
                                      help="The engine's log: PATH, journal:UNIT, docker:NAME, podman:NAME or "
                                           "k8s:NAMESPACE/POD[/CONTAINER] (default: found from the process).")]


def _engine_selector(value: Optional[str]) -> Optional[str]:
    """--engine, checked as it is parsed (inspect, record and serve share it): a value that can name no server
    would only select nothing, far from the typo."""
    if value is not None:
        from kvforensics.collectors.selection import SelectorError, parse

        try:
            parse(value)
        except SelectorError as exc:
            raise UsageProblem(str(exc)) from None
    return value


Engine = Annotated[Optional[str], Option("--engine", callback=_engine_selector,
                                         help="The inference server to explain when a node runs several: its port, "
                                              "or on Kubernetes its pod, NAMESPACE/POD[:PORT] (default: the one "
                                              "holding most GPU memory).")]
# record and serve: every engine on the node unless one is asked for.
EngineFilter = Annotated[Optional[str], Option("--engine", callback=_engine_selector,
                                               help="Record only the inference servers this names: a port (every "
                                                    "pod's server on it), or NAMESPACE/POD[:PORT] (default: every "
                                                    "engine on the node, each with its own run and series).")]
# What record and serve keep in the history, and how long a gone engine stays down in it.
KEEP = "30d"
Keep = Annotated[Optional[str], Option("--keep",
                                       help="Delete samples older than this (30d, 12h, 2w); 'forever' keeps all.")]
GONE_AFTER = "1h"
GoneAfter = Annotated[str, Option("--gone-after",
                                  help="How long an engine recorded and no longer found stays down "
                                       "(kvforensics_engine_up 0, the KvforensicsEngineDown alert) before its "
                                       "series leave: 1h, 24h, 7d; at most --keep.")]
NodeSeriesOption = Annotated[Optional[bool], Option(
    "--node-series/--no-node-series",
    help="Export the node's own series (GPU and host memory, the node's collectors and findings, last success) "
         "besides the engines' (default: yes, but not with --engine: one writer per node exports them).")]

# The history database: record writes it, inspect, history and watch read it.
Db = Annotated[Optional[str], Option("--db",
                                     help="History database (default $KVFORENSICS_DB, "
                                          "/var/lib/kvforensics/history.db as root, else "
                                          "~/.local/state/kvforensics/history.db).")]


class UsageProblem(Exception):
    """Bad input the user can fix; exit 2 with one line."""


def report_format(fmt: Optional[str], as_json: bool) -> str:
    """--format, checked, with --json as its alias for json."""
    if fmt is not None and fmt not in FORMATS:
        raise UsageProblem("--format must be one of {}".format(", ".join(FORMATS)))
    if as_json and fmt not in (None, "json"):
        raise UsageProblem("--json is --format json: do not combine it with --format {}".format(fmt))
    return "json" if as_json else (fmt or "terminal")


def fail_level(fail_on: str) -> Optional[int]:
    """--fail-on, checked, as a severity rank (None: never fail on findings)."""
    from kvforensics.agent.model.severity import severity_rank

    if fail_on not in SEVERITY_CHOICES:
        raise UsageProblem("--fail-on must be one of {}".format(", ".join(SEVERITY_CHOICES)))
    return None if fail_on == "never" else severity_rank(fail_on)


_SIZE_UNITS = {"": 1 << 30, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
               "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$")


def parse_size(text: str, option: str) -> int:
    """'2GiB', '512MiB', '2G' (binary), '2GB' (decimal), '1.5' (GiB) → bytes; one-line usage error."""
    m = _SIZE.match(str(text).lower())
    if m is None or m.group(2) not in _SIZE_UNITS:
        raise UsageProblem("{} takes a size such as 2GiB, 512MiB or 1.5 (GiB), not {!r}".format(option, text))
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if not 0 <= value <= MAX_MARGIN_GIB * (1 << 30):
        raise UsageProblem("{} must be from 0 to {:g} GiB".format(option, MAX_MARGIN_GIB))
    return int(value)


def analysis_options(margin: str, request_tokens: int) -> "Options":
    """--margin and --request-tokens, checked, as analysis Options."""
    from kvforensics.agent.model.records import Options

    margin_bytes = parse_size(margin, "--margin")
    if not 0 < request_tokens <= 10**9:
        raise UsageProblem("--request-tokens must be a positive number of tokens")
    return Options(margin_bytes=margin_bytes, request_tokens=request_tokens, margin_given=margin != MARGIN_GIB)


def check_log_spec(log: Optional[str]) -> None:
    """--log: PATH, journal:UNIT, docker:NAME, podman:NAME or k8s:NAMESPACE/POD[/CONTAINER], checked here
    before anything is collected."""
    if log is not None:
        from kvforensics.collectors.engine_logs import LogSpecError, parse_spec

        try:
            parse_spec(log)
        except LogSpecError as exc:
            raise UsageProblem(str(exc)) from None


def findings_exit_code(level: Optional[int], findings: "List[object]") -> int:
    """1 when a finding is at least as severe as --fail-on, else 0."""
    from kvforensics.agent.model.severity import severity_rank

    if level is not None and any(severity_rank(f.severity) >= level for f in findings):  # type: ignore[attr-defined]
        return exitcodes.EXIT_FINDINGS
    return exitcodes.EXIT_OK


def exit_for_findings(level: Optional[int], findings: "List[object]") -> None:
    """Exit 1 when a finding is at least as severe as --fail-on."""
    code = findings_exit_code(level, findings)
    if code != exitcodes.EXIT_OK:
        raise ExitStatus(code)


def use_color(color: Optional[bool]) -> bool:
    """--color/--no-color, else colour only on a terminal and without NO_COLOR."""
    if color is not None:
        return color
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def terminal_width() -> int:
    """Columns to render for: COLUMNS, else the terminal's; 80 when piped (into less, a ticket, tee: the width every
    report fits), never under 80."""
    import shutil  # here: its import (bz2, lzma, fnmatch) is not paid before a one-host inspect's ssh starts

    return max(80, shutil.get_terminal_size((80, 24)).columns)
