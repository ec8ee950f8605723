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

A call that compiles a new program also compares the processes' plans
(`Arrival.same_plans`) before it runs: the hosts sum chunks laid out by the
plan, so different plans (another ``Config`` or parameter tree on one process)
must be refused on every process alike. Refused inside the program instead,
one process could stop short of an inter-host collective that another is
already in, which would then wait out the collective library's own limit.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

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

    def _client(self) -> Any:
        client = _client()
        if client is None:
            raise RuntimeError(
                f"coarse.sync({self._step}): the mesh spans processes but jax.distributed is not "
                "initialized in this process. Fix: call jax.distributed.initialize(...) (or "
                "coarse_jax.launch.initialize()) before coarse.make_mesh."
            )
        return client

    def wait(self, call: int, timeout_s: float, programs: int = 1) -> None:
        """Returns once every process dispatches call ``call``; raises after ``timeout_s``.

        ``programs``: how many programs of the step this process has compiled.
        It names the barrier, so a process that compiles a new program (other
        shapes) where another does not meets nobody, and both raise.
        """
        client = self._client()
        barrier = f"coarse_jax/{self._id}/{self._step}/{call}/{programs}"
        try:
            client.wait_at_barrier(barrier, max(1, int(timeout_s * 1000)))
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
                f"{jax.process_index()}, with {programs} compiled program(s) of this step). "
                f"Every process must run every step, with the same shapes: check that {who} "
                "is alive and runs the same steps on the same shapes (its log says why not)."
            ) from err

    def same_plans(self, call: int, plan_keys: list[int], timeout_s: float) -> None:
        """Raises ValueError, on every process alike, unless every process's new program
        for call ``call`` has the same plans (``plan_keys``, `Plan.ffi_attrs`'s)."""
        client = self._client()
        me, n = jax.process_index(), jax.process_count()
        digest = hashlib.sha256(",".join(map(str, plan_keys)).encode()).hexdigest()[:32]
        base = f"coarse_jax/{self._id}/{self._step}/{call}/plans"
        client.key_value_set(f"{base}/{me}", digest)
        ms = max(1, int(timeout_s * 1000))
        differ = []
        for h in range(n):
            if h == me:
                continue
            try:
                theirs = client.blocking_key_value_get(f"{base}/{h}", ms)
            except Exception as err:  # jaxlib's JaxRuntimeError
                raise RuntimeError(
                    f"coarse.sync({self._step}): process {h} of {n} did not say which plans "
                    f"its new program for call {call} has within timeout_s={timeout_s:g} s "
                    f"(this is process {me}). Every process must run every step on the same "
                    f"shapes: check that process {h} is alive (its log says why not)."
                ) from err
            if theirs != digest:
                differ.append(h)
        if differ:
            raise ValueError(
                f"coarse.sync({self._step}): the hosts of this mesh synchronize with different "
                f"plans (the plan of host(s) {', '.join(map(str, differ))} differs from this "
                f"host's, process {me}), so the chunks they sum would not line up; no process "
                "ran the step. Fix: pass the same coarse.Config (routes, shard_bytes, "
                "latency_threshold_bytes, timeout_s, topology) and the same parameter tree on "
                "every process; a Config.from_profile measured on each host separately "
                "differs, so profile once and share it."
            )
