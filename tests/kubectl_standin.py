"""Stands in for ``kubectl``, and only for it: no API server can run here. Everything below it is real.

The test writes ``kubectl`` on PATH (a two-line script that runs this file) and a JSON file of its pods
(``KVF_KUBECTL_PODS``): ``{"NS/POD": {"pid": host PID of the pod's init, "path": the image's PATH,
"log": the container's captured stdout, "previous": the previous container's, or null}}``.
* ``exec -i [--context C] -n NS POD [-c C] -- python3 -I -``: ``nsenter --target PID --pid --mount --net``
  into the pod's real namespaces, the command found on the image's PATH, the probe on stdin;
* ``logs [--context C] -n NS POD [-c C] [--tail N] [--previous]``: the captured log;
* ``get pod [--context C] -n NS POD -o json``: the pod object's fields kvforensics reads, from the file's
  ``uid``, ``qos`` (the API's qosClass), ``containers`` (names) and ``annotations``;
* a pod not in the file: kubectl's own message and exit 1.
Every call's argv is appended to ``KVF_KUBECTL_CALLS`` (one JSON list a line).
"""

import json
import os
import sys
from typing import Dict, List, Tuple

NSENTER = "/usr/bin/nsenter"


def parse(argv: List[str]) -> Tuple[str, Dict[str, str], List[str], bool]:
    """(verb, options, positional, previous); what follows ``--`` is the last positional list."""
    verb, opts, pos, previous = argv[0], {}, [], False
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return verb, opts, pos + [argv[i + 1:]], previous  # type: ignore[list-item]
        if a in ("-n", "-c", "--context", "--tail", "-o"):
            opts[a] = argv[i + 1]
            i += 2
            continue
        if a == "--previous":
            previous = True
        elif a != "-i":
            pos.append(a)
        i += 1
    return verb, opts, pos, previous


def logs(pod: Dict[str, str], name: str, container: str, previous: bool) -> int:
    path = pod.get("previous") if previous else pod["log"]
    if not path:
        sys.stderr.write('Error from server (BadRequest): previous terminated container "{}" in pod "{}" not '
                         'found\n'.format(container, name))
        return 1
    with open(path, "rb") as f:
        sys.stdout.buffer.write(f.read())
    return 0


def get(pod: Dict[str, object], name: str, namespace: str) -> int:
    uid = pod.get("uid", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": pod.get("annotations", {})},
           "spec": {"containers": [{"name": c} for c in pod.get("containers", ["main"])]},  # type: ignore[union-attr]
           "status": {"qosClass": pod.get("qos", "Burstable"), "phase": "Running"}}
    sys.stdout.write(json.dumps(obj))
    return 0


def main(argv: List[str]) -> int:
    with open(os.environ["KVF_KUBECTL_CALLS"], "a") as f:
        f.write(json.dumps(argv) + "\n")
    with open(os.environ["KVF_KUBECTL_PODS"]) as f:
        pods = json.load(f)
    verb, opts, pos, previous = parse(argv)
    if verb == "get":
        pos = pos[1:]  # "pod"
    name = pos[0]
    pod = pods.get("{}/{}".format(opts.get("-n", "default"), name))
    if pod is None:
        sys.stderr.write('Error from server (NotFound): pods "{}" not found\n'.format(name))
        return 1
    if verb == "logs" and pod.get("logs_forbidden"):
        sys.stderr.write('Error from server (Forbidden): pods "{}" is forbidden: User "dev" cannot get resource '
                         '"pods/log" in API group "" in the namespace "{}"\n'.format(name, opts.get("-n")))
        return 1
    if verb == "logs":
        return logs(pod, name, opts.get("-c", "main"), previous)
    if verb == "get":
        return get(pod, name, opts.get("-n", "default"))
    command = pos[-1]
    env = dict(os.environ, PATH=pod["path"])
    os.execve(NSENTER, [NSENTER, "--target", str(pod["pid"]), "--pid", "--mount", "--net", "--"] + command, env)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
