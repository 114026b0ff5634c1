"""fastparse answers only as typer would: over generated command lines of every command, wherever
fastparse gives the command its keyword arguments, typer (as ``main`` builds it) gives the same ones, and
wherever typer refuses a command line, fastparse leaves it to typer (or raises the same UsageProblem, from
the same option callback)."""

from __future__ import annotations

import random
from typing import Annotated, Any, Dict, List, Optional, Tuple, Union

import pytest
from kvforensics.agent import cli
from kvforensics.agent.cli import fastparse
from kvforensics.agent.cli.options import UsageProblem
from kvforensics.agent.cli.params import Option, Param

NAMES = [name for name, _, _ in cli.COMMANDS]

# Values tried for each type: ones both readers agree on, and ones fastparse must leave to typer.
VALUES = {
    str: ["x", "a b", "-", "--json", "-v", "", "k8s:ns/pod", "a=b", "é"],
    int: ["7", "-2", "+3", "007", "0", " 7", "1_000", "0x10", "x", "1.5", "9" * 25, ""],
    float: ["1.5", "2", "-0.5", "+.5", "1e3", "5.", "inf", "nan", "x", "1,5", ""],
}
HOSTILE = ["--", "-h", "--help", "--nope", "-vq", "-z", "--json=1", "--no-json", "--colour", "--fo"]

Outcome = Union[Dict[str, Any], Tuple[str, str]]


def _typer(name: str, args: List[str]) -> Outcome:
    """The keyword arguments typer calls the command with, or (exception type, message) where it refuses."""
    import typer

    got: Dict[str, Any] = {}
    app = cli._new_app()
    app.command(name)(cli.typed(cli.command_function(name), call=lambda **kw: got.update(kw)))
    command = typer.main.get_command(app)
    cli._readable_metavars(command)
    try:
        command.main(args=[name] + args, prog_name="kvforensics", standalone_mode=False)
    except Exception as exc:  # noqa: BLE001 - every refusal is an outcome to compare
        return type(exc).__name__, str(exc)
    return got if got else ("no call", "")


def _fast(name: str, args: List[str]) -> Union[None, Outcome]:
    try:
        return fastparse.parse(cli.command_function(name), args)
    except UsageProblem as exc:
        return "UsageProblem", str(exc)


def _params(name: str) -> List[Tuple[str, Param, type]]:
    declared = fastparse._declared(cli.command_function(name))
    assert declared is not None, name
    return [(n, p, base) for n, p, base, _ in declared[0]]


def _tokens(param: Param, base: type, rng: random.Random) -> List[str]:
    """One way of giving this option on a command line."""
    decl = rng.choice(param.decls)
    if base is bool:
        on, _, off = decl.partition("/")
        return [rng.choice([on, off]) if off else on]
    value = rng.choice(VALUES[base])
    if decl.startswith("--") and rng.random() < 0.3:
        return ["{}={}".format(decl, value)]
    return [decl, value]


def _command_line(name: str, rng: random.Random) -> List[str]:
    params = _params(name)
    options = [(p, base) for _, p, base in params if p.kind == "option"]
    args: List[str] = []
    for param, base in rng.sample(options, rng.randint(0, min(4, len(options)))):
        args += _tokens(param, base, rng)
    for _, param, base in params:
        if param.kind == "argument":
            count = rng.choice([0, 1, 1, 2]) if base is list else rng.choice([0, 1, 1, 1, 2])
            for _ in range(count):
                args.insert(rng.randint(0, len(args)), rng.choice(["log.txt", "host-a", "-", "7"]))
    if rng.random() < 0.15:
        args.insert(rng.randint(0, len(args)), rng.choice(HOSTILE))
    if rng.random() < 0.05 and options:
        param, base = rng.choice(options)
        if base is not bool:
            args.append(param.decls[0].partition("/")[0])  # its value missing
    return args


@pytest.mark.parametrize("name", NAMES)
def test_fastparse_agrees_with_typer(name: str) -> None:
    rng = random.Random("fastparse-" + name)
    answered = 0
    for _ in range(250):
        args = _command_line(name, rng)
        fast = _fast(name, args)
        if fast is None:
            continue
        answered += 1
        assert fast == _typer(name, args), args
    assert answered >= 50, "fastparse should read most well-formed {} command lines".format(name)


def test_fastparse_leaves_what_typer_refuses_to_typer() -> None:
    rng = random.Random("fastparse-refusals")
    refused = 0
    for _ in range(400):
        name = rng.choice(NAMES)
        args = _command_line(name, rng)
        expected = _typer(name, args)
        if isinstance(expected, tuple):
            refused += 1
            fast = _fast(name, args)
            assert fast is None or fast == expected, (name, args, fast, expected)
    assert refused >= 40


@pytest.mark.parametrize("name,args", [
    ("analyze", ["examples/kimi-k2.5-tp8-eagle3.log", "--json"]),
    ("analyze", ["--format", "oneline", "-", "--fail-on=never", "--startup", "-2", "--margin", "1.5"]),
    ("record", ["--db", "h.db", "--prom-file", "k.prom", "--nvml-lib", "lib.so", "--no-http", "--quiet",
                "--samples", "6", "--interval", "0"]),
    ("record", ["--engine", "30000", "--keep", "forever", "-q", "--no-node-series"]),
    ("inspect", []),
    ("inspect", ["gpu1", "user@gpu2:2222", "--json", "--parallel", "64", "--timeout", "10", "-i", "key"]),
    ("inspect", ["--from", "bundle.json", "--color", "-v"]),
    ("serve", ["--listen", "0.0.0.0:9842", "--min-interval", "0"]),
    ("history", ["--since", "12h", "--json", "--no-color"]),
    ("watch", ["--count", "3", "--interval", "0.5"]),
    ("probe", ["-o", "probe.py"]),
    ("deploy-files", ["--print", "--bin", "/usr/bin/kvforensics"]),
    ("schema", ["report"]),
])
def test_fastparse_reads_the_common_command_lines(name: str, args: List[str]) -> None:
    fast = _fast(name, args)
    assert fast is not None, args
    assert fast == _typer(name, args)


@pytest.mark.parametrize("name,args", [
    ("analyze", []),  # its LOG is required
    ("analyze", ["a.log", "b.log"]),
    ("analyze", ["a.log", "--help"]),
    ("analyze", ["a.log", "--startup"]),
    ("analyze", ["a.log", "--startup", "x"]),
    ("analyze", ["a.log", "--json=yes"]),
    ("analyze", ["a.log", "--", "--json"]),
    ("probe", []),  # --output is required
    ("inspect", ["-vi", "key"]),
    ("record", ["--quite"]),
])
def test_fastparse_leaves_the_rest_to_typer(name: str, args: List[str]) -> None:
    assert _fast(name, args) is None


def _envvar(level: Annotated[str, Option("--level", envvar="KVF_LEVEL")] = "x") -> None:
    """A parameter typer reads from the environment too."""


def _bounded(count: Annotated[int, Option("--count", min=1)] = 1) -> None:
    """A parameter typer checks against bounds."""


def _context_callback(ctx: object, value: Optional[int]) -> Optional[int]:
    return value


def _ctx(engine: Annotated[Optional[int], Option("--engine", callback=_context_callback)] = None) -> None:
    """A callback that wants typer's context."""


def _plain_level(level: Annotated[str, Option("--level", help="The same, read here.")] = "x") -> None:
    """The control: a parameter this parser reads."""


@pytest.mark.parametrize("command", [_envvar, _bounded, _ctx])
def test_declarations_it_does_not_read_are_left_to_typer(command) -> None:
    assert fastparse.parse(command, []) is None
    assert fastparse.parse(_plain_level, ["--level", "y"]) == {"level": "y"}


def test_option_callbacks_run_on_both_paths() -> None:
    for args in (["--engine", "0"], ["--engine=70000"]):
        assert _fast("record", args) == _typer("record", args) == (
            "UsageProblem", "--engine takes the server's port, 1–65535, not {}".format(args[-1].split("=")[-1]))


def test_help_and_mistakes_still_come_from_typer(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["analyze", "--help"]) == 0
    assert "Usage: kvforensics analyze [OPTIONS] LOG" in capsys.readouterr().out
    assert cli.main(["analyze", "x.log", "--startup", "x"]) == 2
    assert "Invalid value for '--startup'" in capsys.readouterr().err
    assert cli.main(["analyze", "x.log", "--jsn"]) == 2
    assert "No such option: --jsn" in capsys.readouterr().err
