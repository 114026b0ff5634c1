"""typer is the one reader of the command line; ``_fast_coercion`` only spares it pydantic's import for
plain values. Over generated command lines of every command, the command is called with the same keyword
arguments, or refused with the same error, with the shortcut as with typer's own coercion."""

from __future__ import annotations

import random
import typing
from typing import Any, Dict, List, Tuple, Union

import pytest

from kvforensics.agent import cli
from kvforensics.agent.cli.params import Param, declared

NAMES = [name for name, _, _ in cli.COMMANDS]

# Values tried for each type: plain ones the shortcut reads, and ones it leaves to pydantic (and its message).
VALUES = {
    str: ["x", "a b", "-", "--json", "-v", "", "k8s:ns/pod", "a=b", "é"],
    int: ["7", "-2", "+3", "007", "0", " 7", "1_000", "0x10", "x", "1.5", "9" * 25, ""],
    float: ["1.5", "2", "-0.5", "+.5", "1e3", "5.", "inf", "nan", "x", "1,5", ""],
}
HOSTILE = ["--", "-h", "--help", "--nope", "-vq", "-z", "--json=1", "--no-json", "--colour", "--fo"]

Outcome = Union[Dict[str, Any], Tuple[str, str]]


def _typer(name: str, args: List[str], monkeypatch: pytest.MonkeyPatch, shortcut: bool) -> Outcome:
    """The keyword arguments the command is called with, or (exception type, message) where it is refused."""
    import typer

    got: Dict[str, Any] = {}
    app = cli._new_app()
    app.command(name)(cli.typed(cli.command_function(name), call=lambda **kw: got.update(kw)))
    command = typer.main.get_command(app)
    with monkeypatch.context() as m:
        if not shortcut:
            m.setattr(cli, "_fast_coercion", lambda command: None)
        cli._readable_metavars(command)
    try:
        command.main(args=[name] + args, prog_name="kvforensics", standalone_mode=False)
    except Exception as exc:  # noqa: BLE001 - every refusal is an outcome to compare
        return type(exc).__name__, str(exc)
    return got if got else ("no call", "")


def _base(annotation: Any) -> type:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        return list
    return _base(args[0]) if args else annotation


def _params(name: str) -> List[Tuple[Param, type]]:
    return [(param, _base(annotation)) for _, annotation, param in declared(cli.command_function(name))]


def _tokens(param: Param, base: type, rng: random.Random) -> List[str]:
    """One way of giving this option on a command line."""
    decl = rng.choice(param.decls)
    if base is bool:
        on, _, off = decl.partition("/")
        return [rng.choice([on, off]) if off else on]
    value = rng.choice(VALUES.get(base, VALUES[str]))
    if decl.startswith("--") and rng.random() < 0.3:
        return ["{}={}".format(decl, value)]
    return [decl, value]


def _command_line(name: str, rng: random.Random) -> List[str]:
    params = _params(name)
    options = [(p, base) for p, base in params if p.kind == "option"]
    args: List[str] = []
    for param, base in rng.sample(options, rng.randint(0, min(4, len(options)))):
        args += _tokens(param, base, rng)
    for param, base in params:
        if param.kind == "argument":
            count = rng.choice([0, 1, 1, 2]) if base is list else rng.choice([0, 1, 1, 1, 2])
            for _ in range(count):
                args.insert(rng.randint(0, len(args)), rng.choice(["log.txt", "host-a", "-", "7"]))
    if rng.random() < 0.15:
        args.insert(rng.randint(0, len(args)), rng.choice(HOSTILE))
    return args


@pytest.mark.parametrize("name", NAMES)
def test_the_shortcut_coerces_as_typer_does(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random("coercion-" + name)
    called = refused = 0
    for _ in range(120):
        args = _command_line(name, rng)
        fast = _typer(name, args, monkeypatch, shortcut=True)
        assert repr(fast) == repr(_typer(name, args, monkeypatch, shortcut=False)), args  # repr: nan is nan
        called += isinstance(fast, dict)
        refused += isinstance(fast, tuple)
    assert called >= 10 and refused >= 10, (called, refused)  # both kinds of outcome were compared


@pytest.mark.parametrize("name,args", [
    ("analyze", ["examples/kimi-k2.5-tp8-eagle3.log", "--json"]),
    ("analyze", ["--format", "oneline", "-", "--fail-on=never", "--startup", "-2", "--margin", "1.5"]),
    ("record", ["--db", "h.db", "--prom-file", "k.prom", "--nvml-lib", "lib.so", "--no-http", "--quiet",
                "--samples", "6", "--interval", "0"]),
    ("inspect", ["gpu1", "user@gpu2:2222", "--json", "--parallel", "64", "--timeout", "10", "-i", "key"]),
    ("serve", ["--listen", "0.0.0.0:9842", "--min-interval", "0"]),
    ("watch", ["--count", "3", "--interval", "0.5"]),
])
def test_the_common_command_lines_reach_their_command(name: str, args: List[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _typer(name, args, monkeypatch, shortcut=True)
    assert isinstance(fast, dict), fast
    assert fast == _typer(name, args, monkeypatch, shortcut=False)


def test_option_callbacks_run_through_typer(monkeypatch: pytest.MonkeyPatch) -> None:
    for args in (["--engine", "0"], ["--engine=70000"]):
        assert _typer("record", args, monkeypatch, shortcut=True) == (
            "UsageProblem", "--engine takes the server's port, 1–65535, not {}".format(args[-1].split("=")[-1]))


def test_help_and_mistakes_come_from_typer(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["analyze", "--help"]) == 0
    assert "Usage: kvforensics analyze [OPTIONS] LOG" in capsys.readouterr().out
    assert cli.main(["analyze", "x.log", "--startup", "x"]) == 2
    assert "Invalid value for '--startup'" in capsys.readouterr().err
    assert cli.main(["analyze", "x.log", "--jsn"]) == 2
    assert "No such option: --jsn" in capsys.readouterr().err
