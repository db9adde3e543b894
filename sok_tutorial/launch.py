"""``python -m sok_tutorial.launch --workers N script.py [args]``: N local worker processes.

Each worker gets a ``TF_CONFIG`` naming all N (ports chosen free on localhost) and its own
index, so `sok_tutorial.distribute.make_strategy` builds a ``MultiWorkerMirroredStrategy``.
Their output is streamed line by line, prefixed ``[rank i]``. When a worker fails, the others
are stopped at once and the launcher exits with the failed worker's code: no hang waiting for
a collective that will never complete. ``-m module`` runs a module instead of a script.

Example::

    python -m sok_tutorial.launch --workers 2 -m sok_tutorial.examples.train_sharded --steps 20
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on localhost right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("localhost", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def worker_environments(workers: int, ports: list[int] | None = None) -> list[dict[str, str]]:
    """The environment of each worker: this one plus its ``TF_CONFIG``."""
    ports = ports or free_ports(workers)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_COMM_WORLD")}
    return [{**base, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
             "PYTHONUNBUFFERED": "1"} for i in range(workers)]


def _stream(rank: int, pipe: IO[str], lock: threading.Lock) -> None:
    for line in pipe:
        with lock:
            sys.stdout.write(f"[rank {rank}] {line}")
            sys.stdout.flush()


def launch(command: list[str], workers: int, *, grace: float = 5.0) -> int:
    """Run `command` as `workers` processes; 0 when all succeed, else the first failure's code."""
    if workers < 1:
        raise ValueError(f"workers={workers}: expected at least 1")
    lock = threading.Lock()
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for env in worker_environments(workers)]
    threads = [threading.Thread(target=_stream, args=(i, p.stdout, lock), daemon=True) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    failed: list[tuple[int, int]] = []
    try:
        while not failed and any(p.poll() is None for p in procs):
            time.sleep(0.05)
            failed = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        failed = failed or [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
    finally:
        _stop([p for p in procs if p.poll() is None], grace)
        for t in threads:
            t.join(timeout=grace)
    if not failed:
        return 0
    reasons = "; ".join(f"worker {rank} " + (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
                        for rank, code in failed)
    print(f"sok_tutorial.launch: {len(failed)} of {workers} workers failed ({reasons}); stopped the others",
          file=sys.stderr, flush=True)
    code = failed[0][1]
    return code if code > 0 else 128 - code


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher options, command): the command starts at ``-m`` or at the first non-option."""
    for i, arg in enumerate(argv):
        if arg == "-m":
            return argv[:i], [sys.executable, "-m", *argv[i + 1:]]
        if not arg.startswith("-") and (i == 0 or argv[i - 1] != "--workers"):
            return argv[:i], [sys.executable, *argv[i:]]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sok_tutorial.launch",
                                     usage="%(prog)s --workers N (script.py | -m module) [args ...]",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, required=True, help="worker processes to start on this machine")
    options, command = _split(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(options)
    if args.workers < 1:
        parser.error(f"--workers={args.workers}: expected at least 1")
    if len(command) < 2 or command[1:2] == ["-m"] and len(command) < 3:
        parser.error("give a script or -m module")
    if command[1] != "-m" and not os.path.isfile(command[1]):
        parser.error(f"script {command[1]!r} not found")
    return launch(command, args.workers)


if __name__ == "__main__":
    sys.exit(main())
