"""Snapshots on disk: orbax-checkpoint checkpoints of what the proxies hold (DESIGN.md section 8).

The proxies take snapshots in their own memory (ffi/runtime/param_store.h);
this module writes them to ``Config.snapshot_dir`` from a background thread
and reads them back. A checkpoint is a plain orbax ``StandardCheckpointer``
directory holding one pytree::

    {"step": int64 (optimizer steps applied), "params": the f32 master,
     "opt_state": {"mu": ..., "nu": ...} (adam, adamw) | {"trace": ...} (sgd with
     momentum) | {}}

so ``orbax.checkpoint.StandardCheckpointer().restore(path)`` opens it without
coarse_jax. Each is written into ``<dir>/<step>.partial-<pid>/`` and renamed
to ``<dir>/<step>/`` when complete (a rename is atomic on one file system), so
a process killed mid-write leaves no directory that looks complete; restore
reads the newest ``<dir>/<step>/``. The newest ``Config.snapshot_keep`` are kept.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import threading
import weakref
from typing import Any

import jax
import numpy as np

from coarse_jax.api._update import Store

SLOT_NAMES = {0: (), 1: ("trace",), 2: ("mu", "nu")}
_PARTIAL = ".partial-"


def slot_names(store: Store) -> tuple[str, ...]:
    return SLOT_NAMES[store.optimizer.slots]


def to_trees(store: Store, count: int, slots: list[list[np.ndarray]]) -> dict[str, Any]:
    """The checkpoint pytree of a store's exported state (see the module docstring)."""
    master, *moments = (jax.tree.unflatten(store.treedef, leaves) for leaves in slots)
    return {
        "step": np.int64(count),
        "params": master,
        "opt_state": dict(zip(slot_names(store), moments, strict=True)),
    }


def complete_steps(directory: str) -> list[int]:
    """Steps of the complete checkpoints in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def _checkpointer() -> Any:
    """An orbax checkpointer of this process alone.

    Across hosts process 0 writes (every host's proxies hold the same state)
    and each process reads on its own: orbax's default would make every save
    and restore a barrier of all processes.
    """
    import orbax.checkpoint as ocp

    me = jax.process_index()
    only_me = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    return ocp.StandardCheckpointer(multiprocessing_options=only_me)


def read_latest(directory: str) -> tuple[int, dict[str, Any]]:
    """(step, checkpoint pytree) of the newest complete checkpoint in ``directory``."""
    steps = complete_steps(directory)
    if not steps:
        raise FileNotFoundError(
            f"restore: no complete coarse_jax checkpoint in {directory!r} (expected "
            "<dir>/<step>/ directories written by Config(snapshot_dir=...))."
        )
    path = os.path.join(os.path.abspath(directory), str(steps[-1]))
    tree = _checkpointer().restore(path)
    return steps[-1], tree


class SnapshotWriter:
    """Writes snapshots of one store from a daemon thread; the training loop never waits."""

    def __init__(self, directory: str, keep: int) -> None:
        self.directory = os.path.abspath(directory)
        self.keep = keep
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):  # left by a process killed mid-write
            if _PARTIAL in name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self._queue: queue.Queue[tuple[Store, int] | None] = queue.Queue()
        self._offered: dict[int, int] = {}  # store id -> newest serial queued
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="coarse-snapshots", daemon=True)
        self._thread.start()
        _WRITERS.add(self)

    def offer(self, store: Store) -> None:
        """Queues the store's newest snapshot if it is new (cheap: one counter read)."""
        serial = int(store.module().store_snapshot_serial(store.id))
        if serial > self._offered.get(store.id, 0):
            self._offered[store.id] = serial
            self._queue.put((store, serial))

    def flush(self) -> None:
        """Blocks until every queued snapshot is on disk; re-raises a write error."""
        self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"coarse_jax: writing a snapshot failed: {error}") from error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is not None:
                    self._write(item[0])
            except BaseException as e:  # reported by flush(); training goes on
                self._error = e
            finally:
                self._queue.task_done()

    def _write(self, store: Store) -> None:
        got = store.module().store_export(store.id, snapshot=True)
        if got is None:
            return
        count, leaves, values = got
        slots = store.slot_leaves(leaves, values)
        final = os.path.join(self.directory, str(int(count)))
        if os.path.isdir(final):
            return  # this step's snapshot is on disk already
        partial = f"{final}{_PARTIAL}{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        checkpointer = _checkpointer()
        checkpointer.save(partial, to_trees(store, int(count), slots))
        checkpointer.wait_until_finished()
        _testing_crash_point(int(count))
        os.rename(partial, final)
        for old in complete_steps(self.directory)[: -self.keep]:
            shutil.rmtree(os.path.join(self.directory, str(old)), ignore_errors=True)


def _testing_crash_point(step: int) -> None:
    """Tests: ``COARSE_JAX_TEST_KILL_BEFORE_RENAME=<step>`` kills the process (SIGKILL)
    after that step's checkpoint was written but before it was renamed complete."""
    if os.environ.get("COARSE_JAX_TEST_KILL_BEFORE_RENAME") == str(step):
        os.kill(os.getpid(), 9)


_WRITERS: weakref.WeakSet[SnapshotWriter] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    # A normal exit writes what was queued (a killed process cannot).
    for writer in list(_WRITERS):
        try:
            writer.flush()
        except Exception as e:
            print(f"coarse_jax: {e}")
