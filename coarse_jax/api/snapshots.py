"""Snapshots on disk: orbax-checkpoint checkpoints of what the proxies hold.

The proxies take snapshots in their own memory (ffi/runtime/param_store.h);
this module writes them to ``Snapshots.directory`` from a background thread
and reads them back. A checkpoint is a plain orbax ``StandardCheckpointer``
directory holding one pytree::

    {"step": int64 (optimizer steps applied), "params": the f32 master,
     "opt_state": {"mu": ..., "nu": ...} (adam, adamw) | {"trace": ...} (sgd with
     momentum) | {}}

so ``orbax.checkpoint.StandardCheckpointer().restore(path)`` opens it without
coarse_jax. Each is written into ``<dir>/<step>.partial-<pid>/`` and renamed
to ``<dir>/<step>/`` when complete (a rename is atomic on one file system), so
a process killed mid-write leaves no directory that looks complete; restore
reads the newest ``<dir>/<step>/``. The newest ``Snapshots.keep`` are kept.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from coarse_jax._hooks import HOOKS
from coarse_jax.api._stores import ProxyStore

SLOT_NAMES = {0: (), 1: ("trace",), 2: ("mu", "nu")}


@dataclasses.dataclass(frozen=True)
class Snapshots:
    """When the proxies snapshot their state, and where the snapshots are written.

    Given to `coarse.sync` (``snapshots=``), for the step's
    `coarse.value_and_update` calls: a setting, held with the snapshots' writer
    by the step's one holder of the proxies' state
    (`coarse_jax.api.proxy_state.ProxyState`). A snapshot is the proxies' copy of the
    f32 master parameters, the optimizer state and the step count, taken in
    their own memory at the start of the next step's update (in worker k's
    ring call, for proxy k's share); `SyncedStep.snapshot` takes one on
    demand, `SyncedStep.restore` continues from one.

    Attributes:
      every: every this many optimizer steps; 0: only on demand.
      directory: a background thread writes each snapshot as an
        orbax-checkpoint checkpoint ``<directory>/<step>/`` (atomically);
        None: in memory only. Across hosts process 0 writes it (every host's
        proxies hold the same state) and every process restores from it: use
        a directory all hosts can read. Guarantees (CheckFreq's rule): a
        snapshot is complete on disk before the next one is taken (a step that
        would take one while the writer is behind waits for it, reported as
        ``step.stats()["snapshot_wait_s"]``), so after a crash the newest
        complete checkpoint is at most ``2 * every`` steps old; a clean
        interpreter exit (the script's end, ``sys.exit``, an exception) writes
        every snapshot taken first, or exits with status 1 saying which write
        failed.
      keep: how many checkpoints ``directory`` keeps (the newest).

    Raises:
      ValueError: a field out of range, or a ``directory`` with ``every=0``
        (nothing would be written).

    Example:
      >>> import tempfile
      >>> snaps = coarse.Snapshots(every=100, directory=tempfile.mkdtemp(), keep=3)
      >>> snaps.every, snaps.keep
      (100, 3)
      >>> coarse.Snapshots(every=0, directory="ckpt")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
        ...
      ValueError: Snapshots.directory is set but every is 0, so nothing would be written. ...
    """

    every: int = 0
    directory: str | None = None
    keep: int = 2

    def __post_init__(self) -> None:
        for name, least in (("every", 0), ("keep", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"Snapshots.{name}: expected an int >= {least}, got {value!r}.")
        if self.directory is not None and not self.every:
            raise ValueError(
                "Snapshots.directory is set but every is 0, so nothing would be written. "
                "Fix: Snapshots(every=K, directory=...)."
            )
        if self.directory is not None:
            object.__setattr__(self, "directory", os.fspath(self.directory))


_PARTIAL = ".partial-"


def slot_names(store: ProxyStore) -> tuple[str, ...]:
    return SLOT_NAMES[store.optimizer.slots]


def to_trees(store: ProxyStore, count: int, slots: list[list[np.ndarray]]) -> dict[str, Any]:
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
            "<dir>/<step>/ directories written by Snapshots(directory=...))."
        )
    path = os.path.join(os.path.abspath(directory), str(steps[-1]))
    tree = _checkpointer().restore(path)
    return steps[-1], tree


class SnapshotWriter:
    """Writes snapshots of a step's stores from a daemon thread, paced by CheckFreq's rule.

    The rule (the snapshots guide): a snapshot is complete on disk before the
    one after it is taken. The proxies take a snapshot at the start of the
    update after a commit whose count is a multiple of ``Snapshots.every``;
    `pace` runs before each call is dispatched and, while a write is in
    flight and that call would take the next snapshot, waits for the write
    (the wait is counted in ``waited_s``). So after a crash the newest
    complete checkpoint is at most ``2 * Snapshots.every`` steps old. While no
    write is in flight `pace` costs one attribute read.

    `pace` cannot see a snapshot that a step still in flight will take (the
    loop may run ``max_steps_in_flight`` steps ahead of the proxies). For
    that case the runtime keeps the rule itself on one process: once a
    writer is attached (`offer`), an update never copies a due snapshot over
    one the writer has not taken; it defers the copy to a later update, so
    the snapshot is taken a step or two past its multiple of
    ``Snapshots.every`` rather than lost. (Across processes it does not: see
    `offer`.)

    One orbax checkpointer serves every write (creating one per save cost
    about as much as a small model's write itself).
    """

    def __init__(self, directory: str, keep: int) -> None:
        self.directory = os.path.abspath(directory)
        self.keep = keep
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):  # left by a process killed mid-write
            if _PARTIAL in name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self._queue: queue.Queue[tuple[ProxyStore, float] | None] = queue.Queue()
        self._offered: dict[int, int] = {}  # store id -> newest serial queued
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._pending = 0  # offered, not yet complete on disk (or skipped)
        self.on_disk: int | None = None  # the newest complete checkpoint's step, this process
        self.written = 0
        self.waited_s = 0.0  # the loop's waits for the writer (pace, snapshot)
        self.write_s: list[float] = []  # taken -> complete on disk, per checkpoint
        self._checkpointer: Any = None
        self._thread = threading.Thread(target=self._run, name="coarse-snapshots", daemon=True)
        self._thread.start()
        _register_exit_flush()

    def busy(self) -> bool:
        """Whether a snapshot offered is not yet complete on disk."""
        return self._pending > 0

    def offer(self, store: ProxyStore) -> None:
        """Queues the store's newest snapshot if it is new (cheap: one counter read)."""
        if store.runtime.id not in self._offered:
            # Before the store's second snapshot can be taken (the first is
            # taken by the update of its second call at the earliest): the
            # runtime then never copies a snapshot over one not yet written.
            # One process only: across hosts one process writes, and a
            # deferral there alone would leave its proxies' snapshots at
            # other counts than the other hosts' (their in-memory restore
            # must agree); there the loop's pacing alone keeps the rule.
            if jax.process_count() == 1:
                store.runtime.attach_writer()
            self._offered[store.runtime.id] = 0
        serial = store.runtime.snapshot_serial()
        if serial > self._offered[store.runtime.id]:
            self._offered[store.runtime.id] = serial
            with self._lock:
                self._pending += 1
            self._queue.put((store, time.perf_counter()))

    def pace(self, stores: list[ProxyStore], wait_steps: Callable[[], None]) -> None:
        """Before a call: waits for the write in flight if that call would take a snapshot.

        ``wait_steps`` waits for the calls dispatched so far; it runs only
        while a write is in flight (then whether the next update takes a
        snapshot is known exactly).
        """
        if not self.busy():
            return
        began = time.perf_counter()
        wait_steps()
        for store in stores:
            self.offer(store)  # a snapshot the finished calls took
        if any(store.runtime.snapshot_due() for store in stores):
            self.flush()
        self.waited_s += time.perf_counter() - began

    def wait_before_taking(self) -> None:
        """`SyncedStep.snapshot`: the previous snapshot on disk before another is taken."""
        began = time.perf_counter()
        self.flush()
        self.waited_s += time.perf_counter() - began

    @staticmethod
    def idle_stats() -> dict[str, Any]:
        """`stats` of a step without a writer (no ``Snapshots.directory``, or not process 0)."""
        return {
            "snapshot_on_disk": None,
            "snapshots_in_flight": 0,
            "snapshots_written": 0,
            "snapshot_wait_s": 0.0,
            "snapshot_write_s": None,
        }

    def stats(self) -> dict[str, Any]:
        """The figures `SyncedStep.stats` reports (see there)."""
        return {
            "snapshot_on_disk": self.on_disk,
            "snapshots_in_flight": self._pending,
            "snapshots_written": self.written,
            "snapshot_wait_s": self.waited_s,
            "snapshot_write_s": self.write_s[-1] if self.write_s else None,
        }

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
                    self._write(*item)
            except BaseException as e:  # reported by flush(); training goes on
                self._error = e
            finally:
                with self._lock:
                    self._pending -= 1
                self._queue.task_done()

    def _write(self, store: ProxyStore, taken: float) -> None:
        got = store.runtime.export(snapshot=True, for_writer=True)
        if got is None:
            return
        count, leaves, values = got
        slots = store.slot_leaves(leaves, values)
        final = os.path.join(self.directory, str(int(count)))
        if os.path.isdir(final):
            return  # this step's snapshot is on disk already
        partial = f"{final}{_PARTIAL}{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        tree = to_trees(store, int(count), slots)
        try:
            if self._checkpointer is None:
                self._checkpointer = _checkpointer()
            self._checkpointer.save(partial, tree)
            self._checkpointer.wait_until_finished()
        except Exception as e:
            if not (_exiting or "shutdown" in str(e)):
                raise
            # The interpreter is exiting and refuses new threads (Python 3.12
            # does from the start of finalization; orbax starts some per save,
            # and fails as "can't create new thread at interpreter shutdown" or,
            # racing, "cannot join thread before it is started"): write from a
            # child process instead.
            self._checkpointer = None
            shutil.rmtree(partial, ignore_errors=True)
            _save_in_child(partial, tree)
        _testing_crash_point(int(count))
        os.rename(partial, final)
        self.on_disk = max(self.on_disk or 0, int(count))
        self.written += 1
        self.write_s.append(time.perf_counter() - taken)
        for old in complete_steps(self.directory)[: -self.keep]:
            shutil.rmtree(os.path.join(self.directory, str(old)), ignore_errors=True)


_CHILD_SAVE = """
import pickle, sys
import orbax.checkpoint as ocp
with open(sys.argv[1], "rb") as f:
    tree = pickle.load(f)
checkpointer = ocp.StandardCheckpointer()
checkpointer.save(sys.argv[2], tree)
checkpointer.wait_until_finished()
"""


def _save_in_child(path: str, tree: dict[str, Any]) -> None:
    """Writes ``tree`` as the orbax checkpoint ``path`` from a new Python process.

    For the exit flush on interpreters that refuse new threads while they
    finalize (CPython 3.12 sets that flag before threading's exit hooks run;
    3.11 and 3.13 do not), where orbax's save cannot start its threads. A
    child process is allowed. The tree travels pickled (numpy arrays, the
    params' containers); the checkpoint is the one an in-process save writes.
    """
    import pickle
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".pkl", dir=os.path.dirname(path)) as f:
        pickle.dump(jax.tree.map(np.asarray, tree), f)
        f.flush()
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        run = subprocess.run(
            [sys.executable, "-c", _CHILD_SAVE, f.name, path],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    if run.returncode != 0:
        raise RuntimeError(
            f"the exit-time writer process failed ({run.returncode}): {run.stderr[-2000:]}"
        )


def _testing_crash_point(step: int) -> None:
    """Tests (`coarse_jax.testing.kill_before_rename`): kills the process (SIGKILL) after
    that step's checkpoint was written but before it was renamed complete."""
    if HOOKS.kill_before_rename == step:
        os.kill(os.getpid(), 9)


# -- a clean exit keeps every snapshot taken -----------------------------------
#
# At a normal end of the interpreter (the script's end, sys.exit, an exception
# that propagates out) Python first runs threading's exit hooks, then joins
# the non-daemon threads, and only then runs `atexit` callbacks. One of
# threading's hooks is concurrent.futures' (registered when it is imported):
# it forbids new futures, which orbax's save needs. An `atexit` flush came too
# late ("cannot schedule new futures after interpreter shutdown") and lost
# every snapshot not yet written. So the flush registers as a threading exit
# hook of its own, after concurrent.futures and orbax are imported: those
# hooks run in reverse order of registration, so it runs before the pools
# close. `threading._register_atexit` is CPython's (3.9 and on; checked on
# 3.11, 3.12 and 3.13), the same hook concurrent.futures uses. CPython 3.12
# also refuses to start threads from the start of finalization, and orbax
# starts some per save: there a write that hits that refusal is done by a
# child process instead (`_save_in_child`).
#
# Each step that writes registers a flush that first waits for its calls in
# flight (a snapshot is taken inside a step) and offers what they took. If a
# write fails the process says so on stderr and exits with status 1: it never
# exits 0 having lost a snapshot. A process killed (SIGKILL, os._exit) cannot
# flush; the pacing above bounds what it loses.

_EXIT_FLUSHES: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_hook_registered = False
_exiting = False  # set by the exit flush: a failed in-process write retries in a child


def flush_at_exit(step: Any) -> None:
    """Calls ``step.wait_snapshots()`` at a clean interpreter exit while ``step`` lives."""
    _EXIT_FLUSHES.add(step)
    _register_exit_flush()


def _register_exit_flush() -> None:
    global _exit_hook_registered
    if _exit_hook_registered:
        return
    import concurrent.futures.thread  # noqa: F401  its exit hook first, so ours runs before it

    import orbax.checkpoint  # noqa: F401  (and whatever pools orbax registers at import)

    threading._register_atexit(_flush_all)  # type: ignore[attr-defined]
    _exit_hook_registered = True


def _flush_all() -> None:
    global _exiting
    _exiting = True
    lost = []
    for step in list(_EXIT_FLUSHES):
        try:
            step.wait_snapshots()
        except Exception as e:
            lost.append(str(e))
    if lost:
        for message in lost:
            print(f"coarse_jax: a snapshot was not written before exit: {message}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
