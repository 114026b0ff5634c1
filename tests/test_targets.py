"""Host ranges expanded by kvforensics itself, and hosts that cannot be hosts refused in words."""

from __future__ import annotations

import pytest

from kvforensics.agent.remote.targets import expand_targets
from tests.conftest import run_cli


@pytest.mark.parametrize("typed, hosts", [
    (["gpu-[01-03]"], ["gpu-01", "gpu-02", "gpu-03"]),
    (["gpu-[1-2,7]"], ["gpu-1", "gpu-2", "gpu-7"]),
    (["gpu-{01..03}"], ["gpu-01", "gpu-02", "gpu-03"]),
    (["{a,b}-node"], ["a-node", "b-node"]),
    (["rack[1-2]-gpu[8-9]"], ["rack1-gpu8", "rack1-gpu9", "rack2-gpu8", "rack2-gpu9"]),
    (["root@gpu-07:2222", "local"], ["root@gpu-07:2222", "local"]),
])
def test_ranges_expand_like_pdsh_and_bash(typed, hosts):
    assert expand_targets(typed) == hosts


@pytest.mark.parametrize("bad", ["gpu-[01-", "gpu-{01..03", "gpu-[a-c]", "gpu-[]", "gpu-[1-999999]"])
def test_bad_ranges_are_one_line_usage_errors(bad):
    code, out, err = run_cli(["inspect", bad])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_an_unexpanded_brace_never_reaches_the_resolver():
    """From cron or /bin/sh the braces arrive as typed: expanded here, never an idna UnicodeError."""
    from kvforensics.agent.remote import ssh

    with pytest.raises(ssh.SshError) as exc:
        ssh.resolve("gpu-{01..03}x,y", ssh.load_config(None))
    assert "is not a host name" in exc.value.message
