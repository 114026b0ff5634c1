"""--engine: a port, NAMESPACE/POD or NAMESPACE/POD:PORT (collectors/selection.py), and which of a node's
engines it names (collectors/snapshot.py): one to explain, every one to record, several said so."""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

from kvforensics.agent.cli import main
from kvforensics.collectors import selection, snapshot
from kvforensics.collectors.selection import EngineSelector, SelectorError


@pytest.mark.parametrize("text,expected", [
    ("8000", EngineSelector(port=8000)),
    (8000, EngineSelector(port=8000)),
    ("1", EngineSelector(port=1)),
    ("65535", EngineSelector(port=65535)),
    ("team-a/llama-0", EngineSelector(namespace="team-a", pod="llama-0")),
    ("team-a/llama-0:8000", EngineSelector(port=8000, namespace="team-a", pod="llama-0")),
    ("default/vllm-7b.example-5d9f8-x2x4z", EngineSelector(namespace="default", pod="vllm-7b.example-5d9f8-x2x4z")),
])
def test_the_forms_it_takes(text, expected) -> None:
    assert selection.parse(text) == expected
    assert str(expected) == str(text)


@pytest.mark.parametrize("text", [
    "0", "65536", "99999", "-1", "+80", " 8000", "8000 ", "", "llama-0", "team-a/", "/llama-0", "team-a/llama-0:",
    ":8000", "team-a/llama-0:0", "team-a/llama-0:x", "Team-A/llama-0", "team_a/llama-0", "team-a/Llama-0",
    "team-a/llama-0/vllm", "-team/llama-0", "team-a/llama-0-", "a" * 64 + "/pod", "ns/" + "p" * 254, "ns/pod\n",
    "8000\n",
])
def test_what_names_no_server_anywhere_is_one_line(text) -> None:
    with pytest.raises(SelectorError) as caught:
        selection.parse(text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("--engine takes")


def _engine(port: int, pod: Optional[tuple] = None, kind: str = "vllm") -> Dict[str, Any]:
    container = {"runtime": "containerd", "id": "0" * 64, "pod_uid": "uid-" + pod[1], "namespace": pod[0],
                 "pod": pod[1], "name": "vllm"} if pod else None
    server = {"pid": port, "container": container, "cmdline": ["vllm", "serve", "m"]}
    return {"kind": kind, "server": server, "server_args": {"port": port}, "schedulers": [], "helpers": []}


NODE = [_engine(8000, ("team-a", "llama-0")), _engine(8000, ("team-b", "llama-0")), _engine(8001),
        _engine(9000, ("team-a", "qwen-0"))]


@pytest.mark.parametrize("text,explained,recorded", [
    ("8001", 2, [2]),
    ("8000", None, [0, 1]),  # two pods on one port: named both, explained neither
    ("team-b/llama-0", 1, [1]),
    ("team-a/llama-0:8000", 0, [0]),
    ("team-a/llama-0:9000", None, []),
    ("team-c/llama-0", None, []),
    ("7000", None, []),
])
def test_which_engines_a_selector_names(text, explained, recorded) -> None:
    selector = selection.parse(text)
    chosen = snapshot.primary_engine(NODE, {}, selector)
    assert (None if chosen is None else NODE.index(chosen)) == explained
    assert [NODE.index(e) for e in snapshot.explained_engines(NODE, {}, selector)] == recorded


@pytest.mark.parametrize("text,code,message", [
    ("8000", "engines.ambiguous", "--engine 8000 names 2 servers (team-a/llama-0:8000, team-b/llama-0:8000): name "
                                  "one by its pod, NAMESPACE/POD[:PORT]"),
    ("7000", "engines.port_not_found", "no inference server on port 7000 (servers here: team-a/llama-0:8000, "
                                       "team-b/llama-0:8000, 8001, team-a/qwen-0:9000)"),
    ("team-a/qwen-0:8000", "engines.not_found", "no inference server in pod team-a/qwen-0 on port 8000 (servers "
                                                "here: team-a/llama-0:8000, team-b/llama-0:8000, 8001, "
                                                "team-a/qwen-0:9000)"),
])
def test_a_selector_that_names_none_or_several_is_a_problem_that_lists_the_servers(text, code, message) -> None:
    snap: Dict[str, Any] = {"engines": {"engines": NODE}}
    snapshot._not_named(snap, selection.parse(text))
    assert snap["engines"]["problems"] == [{"code": code, "message": message}]


def test_a_worker_names_the_pod_when_the_server_does_not() -> None:
    engine = _engine(8000)
    engine["schedulers"] = [{"pid": 2, "container": NODE[1]["server"]["container"]}]
    assert selection.pod_of(engine) == ("team-b", "llama-0")
    assert selection.describe(engine, 8000) == "team-b/llama-0:8000"
    assert selection.describe(_engine(8001), 8001) == "8001"


@pytest.mark.parametrize("command", ["inspect", "record", "serve"])
def test_the_command_line_refuses_it_in_one_line(command, capsys) -> None:
    assert main([command, "--engine", "Team/x"]) == 2
    err = capsys.readouterr().err
    assert err == "kvforensics: error: --engine takes a port (8000), NAMESPACE/POD or NAMESPACE/POD:PORT, not " \
                  "'Team/x'\n"


def test_a_pod_selector_with_a_k8s_target_is_refused(capsys) -> None:
    """Inside a pod reached through kubectl no kubelet layout names the processes: NAMESPACE/POD would name
    nothing there, and the target already names the pod."""
    assert main(["inspect", "k8s:team-a/llama-0", "--engine", "team-a/llama-0"]) == 2
    assert "a k8s: target is one pod already" in capsys.readouterr().err
