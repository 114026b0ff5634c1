"""What a run reuses from the last one, in the user's cache: the packed probe (found by what os.stat says of the
sources, checked by the hash of its bytes) and the ssh client's version (for that binary only)."""

from __future__ import annotations

import lzma
import os
import time

from kvforensics.agent.remote import openssh, probe


def test_the_probe_comes_from_its_index_and_a_damaged_stream_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made = probe.build({"http": False})  # packs it, keeps the stream and the index
    assert probe._indexed_xz(probe._stat_key()) is not None
    again = probe.build({"http": False})
    assert (again.script, again.code_sha256) == (made.script, made.code_sha256)
    fresh = probe.build({"http": False}, blob=probe.slim_blob())  # built from the sources, no index
    assert (fresh.script, fresh.code_sha256) == (made.script, made.code_sha256)
    (index,) = (tmp_path / "kvforensics").glob("probe-index-*")
    name = index.read_text().split()[2]
    stream = tmp_path / "kvforensics" / name
    stream.write_bytes(lzma.compress(b'{"kvforensics/collectors/probe.py": "raise SystemExit(0)"}'))  # another code
    assert probe._indexed_xz(probe._stat_key()) is None  # its bytes no longer hash as the index says
    rebuilt = probe.build({"http": False})
    assert (rebuilt.script, rebuilt.code_sha256) == (made.script, made.code_sha256)
    index.write_text("../../etc/passwd x y\n")  # a line that is not ours: ignored
    assert probe._indexed_xz(probe._stat_key()) is None and probe.build({"http": False}).script == made.script


def _fake_ssh(folder, version: str):
    calls = folder / "calls"
    ssh = folder / "ssh"
    ssh.write_text("#!/bin/sh\necho run >> {}\necho '{}, OpenSSL 3.0.15 3 Sep 2024' >&2\n".format(calls, version))
    ssh.chmod(0o755)
    return ssh, calls


def test_the_ssh_version_is_asked_once_per_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh, calls = _fake_ssh(bin_dir, "OpenSSH_9.2p1 Debian-2+deb12u7")
    monkeypatch.setenv("PATH", str(bin_dir))
    for _ in range(2):
        monkeypatch.setattr(openssh, "_FOUND", {})
        client = openssh.find_client()
        assert client is not None and client.version == (9, 2) and client.path == str(ssh)
    assert calls.read_text().splitlines() == ["run"]  # the second process read the cache
    ssh.write_text(ssh.read_text().replace("OpenSSH_9.2p1", "OpenSSH_7.4p1"))  # another ssh at that path
    os.utime(str(ssh), ns=(time.time_ns(), time.time_ns() + 10**9))
    monkeypatch.setattr(openssh, "_FOUND", {})
    assert openssh.find_client() is None  # asked again: 7.4 has no accept-new
    assert calls.read_text().splitlines() == ["run", "run"]
