"""Across hosts: every process must dispatch each call of a step, or the others fail naming it.

The inter-host step is an XLA collective (gloo, NCCL): if one process never
runs the program, the others would wait in the collective library, whose own
limits are long (or none) and whose errors name no process. So before each
call a process meets the others at a barrier of ``jax.distributed``'s
coordination service (about 0.4 ms on one machine), bounded by
`Config.timeout_s`; a process that does not arrive makes the others raise an
error naming it. This checks arrival at dispatch only: a process that dies
while a step runs is caught by the collective library and the coordination
service's heartbeats instead.
"""

from __future__ import annotations

import itertools
import re

import jax

from coarse_jax import _jax_compat

_instances = itertools.count()  # steps are built in the same order on every process


def _client() -> object:
    return _jax_compat.distributed_client()


def _missing(message: str) -> list[int]:
    """The process ids a barrier error names as timed out ("Some timed out task names: 1 3")."""
    tail = message.split("timed out task names:", 1)
    if len(tail) < 2:
        return []
    names = tail[1].split("RPC:", 1)[0]
    # "/job:jax_worker/replica:0/task:1" in some versions, a bare "1" in others.
    ids = re.findall(r"task:(\d+)", names) if "task:" in names else re.findall(r"\d+", names)
    return sorted({int(i) for i in ids})


class Arrival:
    """The per-call meeting of all processes for one `coarse.sync` step."""

    def __init__(self, step: str) -> None:
        self._step = step
        self._id = next(_instances)

    def wait(self, call: int, timeout_s: float) -> None:
        """Returns once every process dispatches call ``call``; raises after ``timeout_s``."""
        client = _client()
        if client is None:
            raise RuntimeError(
                f"coarse.sync({self._step}): the mesh spans processes but jax.distributed is not "
                "initialized in this process. Fix: call jax.distributed.initialize(...) (or "
                "coarse_jax.launch.initialize()) before coarse.make_mesh."
            )
        barrier = f"coarse_jax/{self._id}/{self._step}/{call}"
        try:
            client.wait_at_barrier(barrier, max(1, int(timeout_s * 1000)))  # type: ignore[attr-defined]
        except Exception as err:  # jaxlib's JaxRuntimeError
            text = str(err)
            if "DEADLINE_EXCEEDED" not in text and "timed out" not in text.lower():
                raise
            missing = _missing(text)
            names = ", ".join(str(i) for i in missing)
            who = {0: "some process", 1: f"process {names}"}.get(len(missing), f"processes {names}")
            raise RuntimeError(
                f"coarse.sync({self._step}): {who} of {jax.process_count()} did not arrive at call "
                f"{call} within timeout_s={timeout_s:g} s (this is process "
                f"{jax.process_index()}). Every process must run every step: check that "
                f"{who} is alive and runs the same steps (its log says why not)."
            ) from err
