"""Stands in for a container runtime's per-container process (containerd's shim, CRI-O's conmon).

Its command line is the real one's (tests/kubelet.py sets it); what to run comes in ``KVF_SHIM`` (JSON:
``cgroup_procs``, ``log``, ``netns``, ``argv``, ``python``: this interpreter, whose ``sys.executable``
reads the shim's name). Like the real ones it forks the container's process
into the container's cgroup with its stdout and stderr on a pipe, and writes what comes out of the
pipe to the CRI log file, one record per line. The child enters a network namespace of its own with
``unshare --net`` and brings its loopback up before it execs the container's command: the same PID
from the fork to the engine.

Records here are whole lines (``F``): the reader's joining of partial (``P``) records is covered
where it is written, tests/test_logfile.py and tests/test_shipping.py, not by the pod tests.
"""

import json
import os
import sys
import time

# In the new namespace: loopback up (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP), then the command.
LO_UP = """
import fcntl, os, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, b"")))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))
s.close()
os.execvp(sys.argv[1], sys.argv[1:])
"""


def record(line: bytes, stream: str = "stdout") -> bytes:
    ns = time.time_ns()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10 ** 9)) + ".{:09d}Z".format(ns % 10 ** 9)
    return "{} {} F ".format(stamp, stream).encode() + line + b"\n"


def child(config: dict, write_end: int) -> None:
    with open(config["cgroup_procs"], "w") as f:
        f.write("0")  # this process, and all it starts, in the container's cgroup
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    argv = list(config["argv"])
    if config.get("netns"):
        argv = ["unshare", "--net", "--", config["python"], "-c", LO_UP] + argv
    os.execvp(argv[0], argv)


def copy(read_end: int, path: str) -> None:
    pending = b""
    with open(path, "ab", buffering=0) as log:
        while True:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                log.write(record(line))
        if pending:
            log.write(record(pending))


def main() -> int:
    config = json.loads(os.environ.pop("KVF_SHIM"))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            child(config, write_end)
        finally:
            os._exit(127)
    os.close(write_end)
    copy(read_end, config["log"])
    return os.waitpid(pid, 0)[1] >> 8


if __name__ == "__main__":
    sys.exit(main())
