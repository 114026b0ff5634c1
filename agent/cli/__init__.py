"""Command line: ``kvforensics COMMAND``. Thin commands over plain functions, one module each.

``main()`` is the only place that turns outcomes into exit codes (agent/cli/exitcodes.py).
Heavy modules (rich, the model, paramiko) are imported inside commands so ``--help`` stays fast, and
``main()`` imports only the command it runs (``COMMANDS`` names each one's module): ``analyze`` never
loads inspect's SSH and rendering stack. ``app`` (every command) is built on first use.

Each command declares its parameters once (agent/cli/params.py). Typer is the command line, the one reader
of every argument: its help, its shell completion, its error messages. Only the command that runs is built
(``build(only=…)``): typer reads its parameters, not every command's.

Typer 0.2x coerces every parameter's value through a pydantic TypeAdapter, which costs a command
~50–80 ms of imports before it does anything. ``_fast_coercion`` gives the plain types our commands
use (str, int, float, bool) a stdlib coercer that yields what pydantic would, and hands anything
else (and every value it would reject, so the error message is typer's own) to typer's adapter.
"""

from __future__ import annotations

import errno
import importlib
import os
import re
import sys
from typing import TYPE_CHECKING, Annotated, Any, Callable, Dict, List, Optional

from kvforensics.agent.cli import exitcodes, headstart
from kvforensics.agent.cli.options import UsageProblem
from kvforensics.agent.cli.params import ExitStatus, Option, declared

if TYPE_CHECKING:
    import typer

__all__ = ["app", "entry", "main", "UsageProblem", "COMMANDS"]

# Name, module:function, short help, in the order `kvforensics --help` lists them.
COMMANDS = (
    ("analyze", "analyze:analyze", "Explain GPU memory from an engine's startup log, offline."),
    ("inspect", "inspect:inspect", "Inspect nodes live (here or over SSH), reconciled."),
    ("record", "record:record", "Sample into history; export Prometheus metrics (cron)."),
    ("serve", "serve:serve", "Serve /metrics and /healthz, sampling on scrape (DaemonSet)."),
    ("history", "history:history_cmd", "Low-water free memory and peak KV use over time."),
    ("watch", "watch:watch", "Live view of free GPU memory and KV usage."),
    ("probe", "probe:probe", "Write the exact probe shipped to inspected hosts."),
    ("deploy-files", "deploy:deploy_files", "Write cron, systemd, alert, Kubernetes, Grafana files."),
    ("schema", "deploy:schema", "Print a published JSON Schema (report, snapshot, history)."),
)
_APP: "Optional[typer.Typer]" = None


def _new_app() -> "typer.Typer":
    import typer

    made = typer.Typer(
        add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
        no_args_is_help=True,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
        help="Explain where an LLM inference server's GPU memory went, and what to change to turn "
        "free memory into KV tokens and concurrent requests. Sizes are GiB on screen, bytes in JSON. "
        "Environment: NO_COLOR disables colour; KVFORENSICS_DEBUG=1 shows tracebacks of internal errors.",
    )
    made.callback()(typed(_group))
    return made


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            sys.stdout.write("kvforensics {}\n".format(version("kvforensics")))
        except PackageNotFoundError:
            sys.stdout.write("kvforensics (not installed: running from a source tree)\n")
        raise ExitStatus(exitcodes.EXIT_OK)


def _group(
    show_version: Annotated[bool, Option("--version", "-V", callback=_version, is_eager=True,
                                         help="Print the version and exit.")] = False,
) -> None:
    """Explain where an LLM inference server's GPU memory went (see COMMAND --help)."""


def command_function(name: str) -> Callable[..., Any]:
    """The function that runs the command of that name (its module imported now)."""
    module, func = next(where for n, where, _ in COMMANDS if n == name).split(":")
    return getattr(importlib.import_module("kvforensics.agent.cli." + module), func)  # type: ignore[no-any-return]


def typed(func: Callable[..., Any], call: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
    """``func`` as typer reads a command: the same parameters, each declared with typer's own Option or
    Argument made from its Param; running it calls ``call`` (default ``func``) with typer's values."""
    import inspect

    import typer

    annotations: Dict[str, Any] = {}
    params = []
    for p, annotation, param in declared(func):
        if param is None:
            raise TypeError("{}: parameter {} is not declared with one Option or Argument".format(func.__name__,
                                                                                                  p.name))
        made = (typer.Option if param.kind == "option" else typer.Argument)(*param.decls, **dict(param.settings))
        annotations[p.name] = Annotated[annotation, made]
        params.append(p.replace(annotation=annotations[p.name]))
    target = func if call is None else call

    def command(**kwargs: Any) -> Any:
        return target(**kwargs)

    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(command, attr, getattr(func, attr))
    command.__annotations__ = annotations
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return command


def build(only: Optional[str] = None) -> "typer.Typer":
    """The app with every command, or with ``only`` that one (what ``main`` runs: one module imported)."""
    made = _new_app()
    for name, _, short in COMMANDS:
        if only is None or name == only:
            made.command(name, short_help=short)(typed(command_function(name)))
    return made


def __getattr__(name: str) -> Any:
    """``app``: every command, built once on first use (tests, docs); ``main`` builds only what it runs."""
    global _APP
    if name == "app":
        if _APP is None:
            _APP = build()
        return _APP
    raise AttributeError(name)


def _chosen(args: List[str]) -> Optional[str]:
    """The command the arguments name, when they start with one (else every command: help, a typo's
    suggestions and shell completion need them all)."""
    if not args or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None
    return args[0] if any(args[0] == name for name, _, _ in COMMANDS) else None


# What --help shows for each value (typer's defaults read <str>, <list[str]>, {log}).
METAVARS = {
    "--hosts-file": "FILE", "--save": "FILE", "--from": "FILE", "--ssh-config": "FILE", "--db": "FILE",
    "--prom-file": "FILE", "--output": "FILE", "--identity": "FILE", "--nvml-lib": "PATH", "--model-config": "PATH",
    "--log": "SPEC", "--request-tokens": "N", "--startup": "N", "--parallel": "N", "--samples": "N", "--count": "N",
    "--timeout": "SECONDS", "--interval": "SECONDS", "--engine": "PORT|NS/POD", "--fail-on": "SEVERITY",
    "--format": "FORMAT", "--keep": "DURATION", "--listen": "ADDR:PORT", "--min-interval": "DURATION",
    "--since": "DURATION", "--sort": "KEY", "--gone-after": "DURATION",
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
    _fast_coercion(command)
    for sub in getattr(command, "commands", {}).values():
        _readable_metavars(sub)


# The texts whose value every reader agrees on (click's int(), pydantic's lax mode): digits, a sign, a
# decimal point, an exponent. " 7", "1_000", "0x10", "inf" are left to pydantic.
INT_TEXT = re.compile(r"[+-]?[0-9]+\Z")
FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")


def _plain(annotation: Any, value: Any) -> Any:
    """What pydantic's lax mode makes of ``value`` for a plain type, or ``_PYDANTIC`` where unsure."""
    if annotation is bool:
        return value if isinstance(value, bool) else _PYDANTIC
    if annotation is str:
        return value if isinstance(value, str) else _PYDANTIC
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, str) and INT_TEXT.match(value) else _PYDANTIC
    if annotation == List[str]:  # a variadic argument (inspect's HOST…): click hands a tuple of str
        return list(value) if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value) \
            else _PYDANTIC
    if annotation is float:
        if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
            return float(value)
        return float(value) if isinstance(value, str) and FLOAT_TEXT.match(value) else _PYDANTIC
    return _PYDANTIC


_PYDANTIC = object()


class _FastCoercion:
    """typer's runtime coercion contract (``coerce``) for a plain scalar parameter, without pydantic."""

    def __init__(self, param: Any, typer_builder: Any) -> None:
        self._param = param
        self._typer_builder = typer_builder

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return None
        fast = _plain(param.type_descriptor.annotation, value)
        if fast is not _PYDANTIC:
            return fast
        # anything unusual, and every bad value: typer's own coercion (and its error message)
        return self._typer_builder(param.type_descriptor).coerce(value, param=param, ctx=ctx)


def _fast_coercion(command: Any) -> None:
    """Pre-set typer's lazily built coercer of each plain scalar parameter (see the module's docstring).
    Only where typer has the attributes this relies on: another typer version keeps its own coercion."""
    try:
        from typer._coercion import build_runtime_param
    except ImportError:
        return
    for param in getattr(command, "params", ()):
        _fast_param(param, build_runtime_param)
    made_help = getattr(command, "get_help_option", None)
    if made_help is not None:  # -h/--help: made anew for each context, a bool like the others

        def help_option(ctx: Any) -> Any:
            option = made_help(ctx)
            if option is not None:
                _fast_param(option, build_runtime_param)
            return option

        command.get_help_option = help_option


def _fast_param(param: Any, build_runtime_param: Any) -> None:
    desc = getattr(param, "type_descriptor", None)
    info = getattr(desc, "parameter_info", None)
    variadic = param.nargs == -1 and desc is not None and desc.annotation == List[str]
    if (desc is None or info is None or not hasattr(param, "_runtime_param") or (param.nargs != 1 and not variadic)
            or param.multiple or (desc.annotation not in (str, int, float, bool) and not variadic)
            or getattr(desc, "file_annotation", None) is not None
            or any(getattr(info, k, None) is not None for k in ("parser", "click_type", "min", "max"))):
        return
    param._runtime_param = _FastCoercion(param, build_runtime_param)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: run the command, map every outcome to a documented exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        headstart.begin(args)  # one host's ssh on its way while typer loads (agent/cli/headstart.py)
        return _run(args)
    except UsageProblem as exc:
        sys.stderr.write("kvforensics: error: {}\n".format(exc))
        return exitcodes.EXIT_USAGE
    except ExitStatus as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return exitcodes.EXIT_INTERRUPTED
    except BrokenPipeError:
        return exitcodes.EXIT_OK
    except Exception as exc:  # noqa: BLE001 — the one place that turns bugs into exit 4
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click's UsageError family
            return _usage_error(exc)
        if isinstance(exc, OSError) and exc.errno in _FULL:  # the report's own stdout: `> file` on a full disk
            return _unwritable(exc)
        if os.environ.get("KVFORENSICS_DEBUG"):
            raise
        sys.stderr.write("kvforensics: internal error: {}: {} (rerun with KVFORENSICS_DEBUG=1 for a "
                         "traceback, and please report it)\n".format(type(exc).__name__, exc))
        return exitcodes.EXIT_INTERNAL
    finally:
        headstart.end()


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _unwritable(exc: OSError) -> int:
    """The report could not be written (while the command ran, or when flushed at exit): one line, exit 2."""
    sys.stderr.write("kvforensics: error: the output could not be written: {}\n".format(exc.strerror))
    return exitcodes.EXIT_USAGE


def _run(args: List[str]) -> int:
    """The command's exit status, its command line read by typer."""
    import typer

    name = _chosen(args)
    try:
        command = typer.main.get_command(build(name))
        _readable_metavars(command)
        return _status(command.main(args=args, prog_name="kvforensics", standalone_mode=False))
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return exitcodes.EXIT_INTERRUPTED


def _status(result: Any) -> int:
    return int(result) if isinstance(result, int) else exitcodes.EXIT_OK


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
    """The console script and ``python -m kvforensics``: ``main()``, then out without the interpreter's teardown.

    Freeing every module's objects after the answer is written took ~30 ms of a one-host ``inspect`` (strace:
    the last write, then 29 ms of CPU before exit_group): the shell waited for nothing. What a normal exit does
    that matters is done here: the threads still running are joined, the atexit handlers run, stdout and stderr
    are flushed; then the process ends with the command's status."""
    code = main()
    import atexit
    import threading

    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()  # what is still buffered: a short report is written only now
    except BrokenPipeError:  # the reader went away (`| head`): as main() says of it, not an error
        pass
    except OSError as exc:  # a full disk under `> file`: said, not lost behind a status of 0
        code = _unwritable(exc)
    except ValueError:  # stdout closed by the command itself
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)
