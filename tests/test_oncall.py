"""What on call sees first: every mistake in the command line said in one line with exit 2, the help on a
bare command, IPv6 hosts as typed, analyze's oneline, and the probe's own answer read back by --from.
(Failed SSH hosts, one line each whatever the format: tests/test_ssh.py.)"""

from __future__ import annotations

import socket

import pytest

from tests.conftest import ROOT, run_cli

SEED_NODE = str(ROOT / "examples" / "seed-node.json")


def test_ipv6_targets_stay_bracketed():
    """[::1]:PORT is OpenSSH's IPv6 form, not a pdsh range of one host named '::1'."""
    from agent.targets import expand_targets

    typed = ["root@[::1]:2222", "[fe80::1%eth0]:22", "[::1]", "gpu-[1-2]"]
    assert expand_targets(typed) == ["root@[::1]:2222", "[fe80::1%eth0]:22", "[::1]", "gpu-1", "gpu-2"]


def test_an_ipv6_host_is_shown_with_its_port_bracketed():
    try:
        held = socket.socket(socket.AF_INET6)
        held.bind(("::1", 0))  # bound, never listening: refused, and no other process can take it meanwhile
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with held:
        port = held.getsockname()[1]
        target = "root@[::1]:{}".format(port)
        code, out, err = run_cli(["inspect", target, "--format", "oneline", "--timeout", "20"])
        assert code == 3 and out.splitlines()[1].split("\t") == [
            target, "unreachable", "—", "—", "—", "—", "—", "[::1]:{}: Connection refused".format(port)]
        code, out, err = run_cli(["inspect", target, "--timeout", "20"])
    assert (code, out, err) == (3, "", "kvforensics: {}: unreachable: [::1]:{}: Connection refused\n".format(
        target, port))
