"""The proxies' state of a `coarse.sync` step: what `coarse.value_and_update` keeps there.

`ProxyState` is its one holder: a `SyncedStep` owns one, and it owns the
step's stores (one `coarse_jax.api._stores.ProxyStore` per
`coarse.value_and_update` call, each holding its runtime store's handle), a
load asked for before the first trace, the snapshot writer and, with
``mode="reference"``, the state threaded through the program instead. Its
methods (`optimizer_state`, `master_params`, `load_optimizer_state`,
`reset_optimizer`, `snapshot`, `wait_snapshots`, `restore`) are the step's,
which forwards to them; `before_call` and `after_call` are what a call of the
step does with that state. The step itself (binding, compile, dispatch) lives
in `coarse_jax.api.sync`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from coarse_jax.api._stores import ProxyStore
from coarse_jax.api.snapshots import (
    Snapshots,
    SnapshotWriter,
    flush_at_exit,
    read_latest,
    slot_names,
)
from coarse_jax.api.update import to_jax
from coarse_jax.dispatch.params_check import ParamsCheck


class ProxyState:
    """The state the proxies hold for one step, and the step's methods that reach it.

    Args:
      name: the step's name, for errors (``coarse.sync(name).method``).
      reference: whether the step runs ``mode="reference"`` (a re-profiled
        Config keeps the mode).
      wait_all: blocks until the step's calls in flight finished.

    It holds nothing that holds the step (the step is freed by reference
    counting alone, and its runtime stores with it).
      params_check: the step's params check (a load or restore re-seeds it).
      snapshots: when the proxies snapshot and where they write.
    """

    def __init__(
        self,
        name: str,
        reference: bool,
        wait_all: Callable[[], None],
        params_check: ParamsCheck,
        snapshots: Snapshots,
    ) -> None:
        self._name = name
        self._reference = reference
        self._wait_all = wait_all
        self._params_check = params_check
        self.snapshots = snapshots
        # The proxies' optimizer stores, per value_and_update call of the step.
        self.stores: dict[int, ProxyStore] = {}
        # A load asked for before the step's first trace (it names the stores).
        self._pending_load: Callable[[], None] | None = None
        self.writer: SnapshotWriter | None = None  # Snapshots.directory
        self.restored_count: int | None = None  # optimizer steps of the last restore()
        # mode="reference" value_and_update: (f32 master, optax state) per call
        # position, threaded through the program (api/_stores.reference_update).
        self.ref_state: dict[int, Any] = {}
        self.ref_optimizers: dict[int, Any] = {}

    # -- what a call of the step does with the state ---------------------------

    def before_call(self, trace: Callable[[], Any]) -> None:
        """Before a call is dispatched: a pending load (``trace`` first if no trace has
        named the stores yet), then the writer's pacing (a snapshot on disk before the
        next is taken)."""
        if self._pending_load is not None:
            if not self.stores:  # trace now: the stores come from the trace
                trace()
            load, self._pending_load = self._pending_load, None
            load()
        if self.writer is not None:
            self.writer.pace(list(self.stores.values()), self._wait_all)

    def after_call(self) -> None:
        """After a call is dispatched: offers the stores' new snapshots to the writer.

        Across processes every host's proxies hold the same master and state
        (they apply the same update), so one process writes the directory;
        every process can restore from it.
        """
        snaps = self.snapshots
        if snaps.directory is not None and self.stores and jax.process_index() == 0:
            if self.writer is None:
                self.writer = SnapshotWriter(snaps.directory, snaps.keep)
                flush_at_exit(self)
            for store in self.stores.values():
                self.writer.offer(store)

    # -- the step's methods -----------------------------------------------------

    def _who(self, what: str) -> str:
        """How an error names method ``what`` of this step."""
        return f"coarse.sync({self._name}).{what}"

    def _store(self, index: int | None, what: str) -> ProxyStore:
        """The store of the step's value_and_update call ``index`` (the only one if None)."""
        who = self._who(what)
        if not self.stores:
            raise RuntimeError(
                f"{who}: the step has no coarse.value_and_update (or has not run yet): call it "
                "once first."
            )
        if index is None:
            if len(self.stores) > 1:
                raise ValueError(
                    f"{who}: the step has {len(self.stores)} value_and_update calls; pass "
                    "index= (0 for the first) to say which."
                )
            index = next(iter(self.stores))
        if index not in self.stores:
            raise ValueError(
                f"{who}: no value_and_update call {index}; the step has {sorted(self.stores)}."
            )
        return self.stores[index]

    def _read(self, index: int | None, what: str) -> tuple[ProxyStore, int, list[Any]]:
        """(store, count, [slot][params leaf] f32 arrays) once the calls in flight are done."""
        store = self._store(index, what)
        self._wait_all()
        count, slots = store.read(self._who(what))
        return store, count, slots

    def optimizer_state(self, index: int | None = None) -> Any:
        """The optax state of the optimizer the proxies run, as they hold it now.

        Waits for the calls in flight.

        Args:
          index: which `coarse.value_and_update` call of the step (needed
            when there are several).

        Returns:
          The same pytree as ``optimizer.optax().init(params)``
          (``optax.adamw(...)`` etc.), leaves in f32.

        Raises:
          RuntimeError: the step has no `coarse.value_and_update`, or no step
            has finished yet.
          ValueError: ``index`` is missing while the step has several such
            calls, or names none of them.

        Example:
          >>> opt = coarse.optim.sgd(0.1)
          >>> loss = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          >>> step = coarse.sync(lambda p, b: coarse.value_and_update(loss, opt)(p, b)[::-1], mesh)
          >>> params, _ = step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
          >>> jax.tree.leaves(step.optimizer_state()) == []    # optax.sgd(0.1)'s: empty
          True
        """
        if self._reference:
            return self._ref_held(index, "optimizer_state")[1]
        store, count, slots = self._read(index, "optimizer_state")
        master = to_jax(slots[0], store.treedef)
        moments = [to_jax(x, store.treedef) for x in slots[1:]]
        return store.optimizer.optax_state(master, count, moments)

    def master_params(self, index: int | None = None) -> Any:
        """The f32 master parameters the proxies hold. Waits for the calls in flight.

        Args:
          index: which `coarse.value_and_update` call of the step (needed
            when there are several).

        Returns:
          The params' tree with f32 leaves, as the proxies hold them after
          the latest finished step.

        Raises:
          RuntimeError: as `optimizer_state` (no `coarse.value_and_update`, or
            no step finished yet).
          ValueError: as `optimizer_state` (``index`` missing or unknown).

        Example:
          >>> opt = coarse.optim.sgd(0.1)
          >>> loss = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          >>> step = coarse.sync(lambda p, b: coarse.value_and_update(loss, opt)(p, b)[::-1], mesh)
          >>> params, _ = step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
          >>> bool(jnp.all(step.master_params()["w"] == params["w"]))    # f32, as returned
          True
        """
        if self._reference:
            return self._ref_held(index, "master_params")[0]
        store, _, slots = self._read(index, "master_params")
        return to_jax(slots[0], store.treedef)

    def load_optimizer_state(self, params: Any, opt_state: Any, index: int | None = None) -> None:
        """Makes the proxies continue from ``params`` and an optax ``opt_state``.

        The next call must pass ``params``. Before the step's first call the
        load waits for it (the step is traced then).

        Args:
          params: the parameters to continue from (the params' tree).
          opt_state: a state of ``optimizer.optax()``, from plain optax
            training or from `optimizer_state`.
          index: which `coarse.value_and_update` call of the step (needed
            when there are several).

        Raises:
          RuntimeError: the step has no `coarse.value_and_update`.
          ValueError: ``params`` or ``opt_state`` do not have the structure
            and shapes of the step's params and optimizer.

        Example:
          >>> opt = coarse.optim.adam(1e-2)
          >>> @coarse.sync(mesh)
          ... def step(params, batch):
          ...     f = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          ...     return coarse.value_and_update(f, opt)(params, batch)[::-1]
          >>> params = {"w": jnp.ones((3,))}
          >>> opt_state = opt.optax().init(params)          # e.g. from optax training
          >>> step.load_optimizer_state(params, opt_state)  # applied at the first call
          >>> params, loss = step(params, jnp.ones((8, 3)))
          >>> int(step.optimizer_state()[0].count)
          1
        """

        if self._reference:
            master = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
            self.ref_state = {**self.ref_state, index or 0: (master, opt_state)}
            return

        def load() -> None:
            store = self._store(index, "load_optimizer_state")
            count, slots = store.optimizer.from_optax_state(opt_state)
            self._wait_all()
            store.write(params, count, slots, self._who("load_optimizer_state"))
            self._params_check.seeds_next()  # from the loaded state: nothing to check

        self._load_when_traced(load)

    def _load_when_traced(self, load: Callable[[], None]) -> None:
        if self._access_ready():
            load()
        else:
            self._pending_load = load

    def snapshot(self, index: int | None = None) -> int:
        """Takes a snapshot of the proxies' state now; returns its optimizer step count.

        Waits for the calls in flight, then copies the committed version in
        the proxies' memory; with ``Snapshots.directory`` it is also queued for
        writing (`wait_snapshots` waits for the disk).

        Args:
          index: which `coarse.value_and_update` call of the step (needed
            when there are several).

        Returns:
          The optimizer step count of the snapshot.

        Raises:
          NotImplementedError: the step runs in ``mode="reference"``.
          RuntimeError: the step has no `coarse.value_and_update` (or has not
            run).

        Example:
          >>> opt = coarse.optim.sgd(0.1)
          >>> loss = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          >>> step = coarse.sync(lambda p, b: coarse.value_and_update(loss, opt)(p, b)[::-1], mesh)
          >>> params, _ = step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
          >>> step.snapshot()
          1
        """
        self._refuse_reference("snapshot")
        store = self._store(index, "snapshot")
        self._wait_all()
        if self.writer is not None:  # the previous one on disk first (CheckFreq's rule)
            self.writer.offer(store)
            self.writer.wait_before_taking()
        count = store.runtime.snapshot_now()
        if self.writer is not None:
            self.writer.offer(store)
        return count

    def wait_snapshots(self) -> None:
        """Blocks until the proxies' newest snapshot is written to ``Snapshots.directory``.

        Waits for the calls in flight first (a snapshot is taken when a step
        starts), takes a snapshot that is due and not yet taken (after the
        step whose count is a multiple of ``Snapshots.every``: the next step
        would take it), then waits for the writer thread. A clean interpreter
        exit does the same by itself. Across processes only process 0 writes
        (every host holds the same state): elsewhere this returns at once.
        Without ``Snapshots.directory`` it returns at once.

        Raises:
          RuntimeError: writing a snapshot failed (the writer's error is its
            cause).

        Example:
          >>> import tempfile
          >>> snaps = coarse.Snapshots(every=1, directory=tempfile.mkdtemp())
          >>> @coarse.sync(mesh, snapshots=snaps)
          ... def step(params, batch):
          ...     f = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          ...     return coarse.value_and_update(f, coarse.optim.sgd(0.1))(params, batch)[::-1]
          >>> params, loss = step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
          >>> step.wait_snapshots()
          >>> step.stats()["snapshot_on_disk"]
          1
        """
        if self.writer is not None:
            self._wait_all()
            for store in self.stores.values():
                self.writer.offer(store)
                if store.runtime.snapshot_due():
                    self.writer.wait_before_taking()
                    store.runtime.snapshot_now()
                    self.writer.offer(store)
            self.writer.flush()

    def restore(self, directory: str | None = None, index: int | None = None) -> Any:
        """Rolls the proxies back and returns the params the workers continue from.

        Without ``directory``: to the newest in-memory snapshot (after a NaN
        loss, say). With one: to the newest complete checkpoint there, also in
        a fresh process before the step's first call. The returned params are
        the f32 master, in the params' dtypes once the step has run (f32
        before); pass them to the next call. ``self.restored_count`` is the
        optimizer step count restored (the data position to resume from).

        Args:
          directory: a ``Snapshots.directory`` to load the newest complete
            checkpoint from; None rolls back to the newest in-memory snapshot.
          index: which `coarse.value_and_update` call of the step (needed
            when there are several).

        Returns:
          The params to pass to the next call.

        Raises:
          NotImplementedError: the step runs in ``mode="reference"``.
          RuntimeError: the proxies hold no complete snapshot (without
            ``directory``), or the step has no `coarse.value_and_update`.
          FileNotFoundError: ``directory`` holds no complete checkpoint.

        Example:
          >>> opt = coarse.optim.sgd(0.1)
          >>> loss = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          >>> step = coarse.sync(lambda p, b: coarse.value_and_update(loss, opt)(p, b)[::-1], mesh)
          >>> params, _ = step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
          >>> count = step.snapshot()                           # step 1
          >>> params, _ = step(params, jnp.ones((8, 3)))        # step 2
          >>> params = step.restore()                           # back to step 1
          >>> step.restored_count
          1
        """
        self._refuse_reference("restore")
        if directory is None:
            store = self._store(index, "restore")
            self._wait_all()
            got = store.runtime.export(snapshot=True)
            if got is None:
                raise RuntimeError(
                    f"{self._who('restore')}: the proxies hold no complete snapshot. "
                    "Fix: coarse.sync(..., snapshots=coarse.Snapshots(every=K)), or call "
                    "step.snapshot() first."
                )
            count, leaves, values = got
            store.runtime.load(*got)
            self._params_check.seeds_next()
            master = store.slot_leaves(leaves, values[:1])[0]
            params = jax.tree.unflatten(
                store.treedef,
                [jnp.asarray(x, dtype=d) for x, d in zip(master, store.dtypes, strict=True)],
            )
            self.restored_count = int(count)
            return params
        count, tree = read_latest(directory)
        params = jax.tree.map(jnp.asarray, tree["params"])

        def load() -> None:
            store = self._store(index, "restore")
            moments = [tree["opt_state"][name] for name in slot_names(store)]
            self._wait_all()
            store.write(params, int(tree["step"]), moments, self._who("restore"))
            self._params_check.seeds_next()

        self._load_when_traced(load)
        self.restored_count = int(count)
        if self._access_ready():
            store = self._store(index, "restore")
            params = jax.tree.unflatten(
                store.treedef,
                [x.astype(d) for x, d in zip(jax.tree.leaves(params), store.dtypes, strict=True)],
            )
        return params

    def reset_optimizer(self, index: int | None = None) -> None:
        """Forgets the proxies' state: the next call seeds it from the params it gets.

        Use it to continue from params the step did not return (another
        run's, say) with a fresh optimizer state.

        Args:
          index: which `coarse.value_and_update` call of the step (needed
            when there are several).

        Example:
          >>> opt = coarse.optim.sgd(0.1)
          >>> loss = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
          >>> step = coarse.sync(lambda p, b: coarse.value_and_update(loss, opt)(p, b)[::-1], mesh)
          >>> params, _ = step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
          >>> step.reset_optimizer(index=0)
          >>> params, _ = step({"w": jnp.zeros((3,))}, jnp.ones((8, 3)))  # other params: fine
        """
        self._pending_load = None
        if self._reference:
            self.ref_state = {k: v for k, v in self.ref_state.items() if k != (index or 0)}
            return
        if not self._access_ready():
            return
        store = self._store(index, "reset_optimizer")
        self._wait_all()
        store.runtime.reset()
        self._params_check.seeds_next()  # from the params it gets: nothing to check

    def _refuse_reference(self, what: str) -> None:
        if self._reference:
            raise NotImplementedError(
                f"{self._who(what)}: snapshots are taken by the runtime on the "
                "proxies, which Config(mode='reference') does not use. Fix: mode='ffi', or "
                "save step.optimizer_state() and step.master_params() yourself."
            )
        if any(store.delayed for store in self.stores.values()):
            raise NotImplementedError(
                f"{self._who(what)}: a value_and_update(delayed=True) holds a "
                "pending gradient a snapshot would not keep. Fix: drop delayed=True to take "
                "snapshots."
            )

    def _ref_held(self, index: int | None, what: str) -> Any:
        """mode="reference": the (master, optax state) of value_and_update call ``index``."""
        i = index or 0
        if i not in self.ref_state:
            raise RuntimeError(
                f"{self._who(what)}: no state for value_and_update call {i} "
                "(the step has none, or has not run yet): call it once first."
            )
        return self.ref_state[i]

    def _access_ready(self) -> bool:
        return bool(self.stores)
