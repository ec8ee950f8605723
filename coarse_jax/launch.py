"""Run a script as several jax processes on this machine: ``python -m coarse_jax.launch``.

For trying the multi-host mesh (``("host", "tier", "data")``) on one machine::

    python -m coarse_jax.launch --processes 2 --devices-per-process 8 train.py --steps 20

starts ``--processes`` copies of ``python train.py --steps 20``, each with
``--devices-per-process`` virtual CPU devices, a coordinator on a free local
port and these environment variables, read by `initialize`:

* ``COARSE_JAX_COORDINATOR``: ``host:port`` of process 0's coordination service;
* ``COARSE_JAX_NUM_PROCESSES`` / ``COARSE_JAX_PROCESS_ID``.

Each line a process prints is forwarded with a ``[p<id>] `` prefix. When a
process exits with an error, the others are stopped and the launcher exits
with that process's code (the first failure's); otherwise with 0. The script
calls `initialize` (or ``jax.distributed.initialize`` itself) before
``coarse.make_mesh``. On a GPU cluster, use the scheduler instead (one
process per host, ``jax.distributed.initialize()`` reads SLURM / Open MPI
environments); see the README.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

ENV_COORDINATOR = "COARSE_JAX_COORDINATOR"
ENV_NUM_PROCESSES = "COARSE_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "COARSE_JAX_PROCESS_ID"


def initialize(*, timeout_s: int = 120) -> bool:
    """``jax.distributed.initialize`` from the launcher's environment; gloo for CPU collectives.

    Call it first thing in a script run by ``python -m coarse_jax.launch``
    (before any jax computation). Outside the launcher (no
    ``COARSE_JAX_COORDINATOR``) it does nothing and returns False.

    Args:
      timeout_s: how long to wait for every process to connect.

    Returns:
      Whether jax.distributed was initialized.

    Example:
      >>> from coarse_jax.launch import initialize
      >>> initialize()  # then coarse.make_mesh(workers=4) spans the processes
    """
    address = os.environ.get(ENV_COORDINATOR)
    if not address:
        return False
    import jax

    # The CPU client needs a cross-process collectives implementation.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        address,
        int(os.environ[ENV_NUM_PROCESSES]),
        int(os.environ[ENV_PROCESS_ID]),
        initialization_timeout=timeout_s,
    )
    return True


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _forward(stream: IO[str], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            out.write(prefix + line)
            out.flush()


def _stop(procs: Sequence[subprocess.Popen[str]], grace_s: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.poll() is None:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def launch(
    argv: Sequence[str],
    processes: int,
    devices_per_process: int | None = None,
    *,
    port: int | None = None,
    timeout_s: float | None = None,
    out: IO[str] | None = None,
) -> int:
    """Runs ``python *argv`` as ``processes`` jax processes; returns the exit code.

    Args:
      argv: the script and its arguments.
      processes: how many processes.
      devices_per_process: virtual CPU devices per process (sets ``XLA_FLAGS``
        and ``JAX_PLATFORMS=cpu``); None leaves the environment's.
      port: the coordinator's port; default: a free one.
      timeout_s: stop everything and return 124 after this long.
      out: where the prefixed output goes (default stdout).

    Returns:
      0, the first failing process's exit code, or 124 on timeout.
    """
    if processes < 1:
        raise ValueError(f"launch: processes must be >= 1, got {processes}.")
    out = out or sys.stdout
    port = port or free_port()
    procs: list[subprocess.Popen[str]] = []
    threads = []
    lock = threading.Lock()
    for i in range(processes):
        env = dict(os.environ)
        env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
        env[ENV_NUM_PROCESSES] = str(processes)
        env[ENV_PROCESS_ID] = str(i)
        env["PYTHONUNBUFFERED"] = "1"
        if devices_per_process is not None:
            flag = f"--xla_force_host_platform_device_count={devices_per_process}"
            kept = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
            env["XLA_FLAGS"] = " ".join([*kept, flag])
            env["JAX_PLATFORMS"] = "cpu"
        proc = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        procs.append(proc)
        assert proc.stdout is not None
        t = threading.Thread(target=_forward, args=(proc.stdout, f"[p{i}] ", out, lock))
        t.daemon = True
        t.start()
        threads.append(t)
    start = time.monotonic()
    code = 0
    try:
        while True:
            states = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(states) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                with lock:
                    out.write(f"[launch] process {i} exited with code {code}; stopping the rest\n")
                break
            if all(c == 0 for c in states):
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                with lock:
                    out.write(f"[launch] timed out after {timeout_s:g} s; stopping every process\n")
                code = 124
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
        for t in threads:
            t.join(timeout=2.0)
    return code


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coarse_jax.launch",
        description="Run a script as several jax processes on this machine (gloo on CPU).",
    )
    parser.add_argument("--processes", type=int, required=True, help="number of processes")
    parser.add_argument(
        "--devices-per-process", type=int, default=None, help="virtual CPU devices per process"
    )
    parser.add_argument("--port", type=int, default=None, help="coordinator port (default: free)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args(args)
    return launch(
        [ns.script, *ns.script_args],
        ns.processes,
        ns.devices_per_process,
        port=ns.port,
        timeout_s=ns.timeout,
    )


if __name__ == "__main__":
    sys.exit(main())
