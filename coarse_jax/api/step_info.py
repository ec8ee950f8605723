"""What a `coarse.sync` step tells about itself: its config, counters, timeline and memory.

A base class of `SyncedStep <coarse_jax.api.sync.SyncedStep>` holding no
state: it reads what the step owns (its config, counters, compiled programs,
calls in flight, plans, and its `ProxyState <coarse_jax.api.proxy_state.ProxyState>`)
and changes none of it.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from coarse_jax import _ffi
from coarse_jax.api.memory import MemoryReport, StepMemory, tally
from coarse_jax.api.proxy_state import ProxyState
from coarse_jax.api.snapshots import SnapshotWriter
from coarse_jax.api.timeline import Timeline
from coarse_jax.config import Config
from coarse_jax.dispatch import placement as _placement
from coarse_jax.dispatch.binding import CallBinding
from coarse_jax.dispatch.compiles import Compiles
from coarse_jax.dispatch.in_flight import InFlight
from coarse_jax.mesh import Tiers, platform


class StepInfo:
    """The inspection methods of `SyncedStep` (its config, stats, timeline, memory)."""

    mesh: Mesh
    _tiers: Tiers
    _config: Config
    _calls: int
    _reprofiles: int
    _compiled: dict[Any, Any]
    _compiles: Compiles
    _in_flight: InFlight
    _proxies: ProxyState
    _traced_plans: list[Any]
    _all_workers: Any

    def _wait_all(self) -> None:
        raise NotImplementedError  # the step's: blocks until its calls in flight finish

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[CallBinding, Any, Any]:
        raise NotImplementedError  # the step's: the call's binding, arguments, NNX state

    def _compile(self, cfg: Config, binding: CallBinding, check: bool) -> Any:
        raise NotImplementedError  # the step's: the jitted program of a binding

    def config(self) -> Config:
        """The `Config` in use (re-profiling may have replaced the one given).

        Returns:
          The step's `coarse.Config`, the one passed to `coarse.sync` (or the
          default), or the one the latest re-profile planned with.

        Example:
          >>> step = coarse.sync(lambda x: coarse.all_reduce(x), mesh=mesh,
          ...                    config=coarse.Config(shard_bytes=1 << 20))
          >>> step.config().shard_bytes
          1048576
        """
        return self._config

    def stats(self) -> dict[str, Any]:
        """The step's counters, and its snapshot writer's.

        Returns:
          A dict with ``calls`` made (executions, also when an outer ``jax.jit`` traced the
          step once and runs it many times), ``reprofiles`` done, executables
          ``compiled`` (XLA compiles a program once per argument type and
          placement: a recompile warns once, naming the argument), calls
          ``in_flight`` (dispatched, not seen finished; at most
          `Config.max_steps_in_flight`). With ``Snapshots.directory`` (on
          the process that writes, process 0): ``snapshot_on_disk``, the
          optimizer step of the newest checkpoint this process completed (None
          before the first); ``snapshots_in_flight``, taken and not yet
          complete on disk; ``snapshots_written``; ``snapshot_wait_s``, the
          seconds the loop waited for the writer in all (a snapshot is on disk
          before the next is taken: see `coarse.Snapshots`); and
          ``snapshot_write_s``, the last checkpoint's time from taken to
          complete on disk. Without a writer these are None / 0.

        Example:
          >>> step = coarse.sync(lambda x: coarse.all_reduce(x), mesh=mesh)
          >>> _ = step(jnp.ones((8, 2)))
          >>> stats = step.stats()
          >>> stats["calls"], stats["compiled"], stats["snapshots_written"]
          (1, 1, 0)
        """
        writer = self._proxies.writer
        writer_stats = SnapshotWriter.idle_stats() if writer is None else writer.stats()
        return {
            "calls": self._calls,
            "reprofiles": self._reprofiles,
            "compiled": self._compiles.total(list(self._compiled.values())),
            "in_flight": len(self._in_flight),
            **writer_stats,
        }

    def timeline(self) -> Timeline:
        """The spans recorded since the last call, with ``Config(trace=True)``.

        Waits for the calls in flight. The runtime keeps one buffer per
        process: spans of every traced step since the previous `timeline` call.

        Returns:
          A `Timeline <coarse_jax.diagnostics.Timeline>` of `Span
          <coarse_jax.diagnostics.Span>` s; ``.to_chrome(path)`` writes a
          Chrome trace, ``.plot(path)`` draws it. Empty without
          ``Config(trace=True)``.

        Example:
          >>> cfg = coarse.Config(trace=True, xla_below_bytes=0)  # even a tiny tree: proxies
          >>> step = coarse.sync(lambda x: coarse.all_reduce(x), mesh=mesh, config=cfg)
          >>> _ = step(jnp.ones((8, 2)))
          >>> sorted({span.name for span in step.timeline().spans})[:3]
          ['proxy ring', 'pull', 'pull piece']
        """
        self._wait_all()
        module = _ffi.runtime_module(platform(self._tiers))
        return Timeline.from_runtime(module.take_trace())

    def memory_report(self, *args: Any, **kwargs: Any) -> MemoryReport:
        """Per device and tier, the bytes the step holds when called with ``args``.

        The same as ``coarse.diagnostics.memory_report(step, *args)``:
        compiles the step for ``args`` (arrays or ``jax.ShapeDtypeStruct``
        values; nothing runs) and adds the runtime's storage and the
        proxies' optimizer state.

        Returns:
          A `coarse.diagnostics.MemoryReport`.

        Example:
          >>> cfg = coarse.Config(xla_below_bytes=0)  # even a tiny tree: proxies
          >>> step = coarse.sync(lambda x: coarse.all_reduce(x), mesh=mesh, config=cfg)
          >>> step.memory_report(jnp.ones((8, 1024))).proxy.runtime_storage_bytes > 0
          True
        """
        return tally(self._memory_parts(*args, **kwargs))

    def _memory_parts(self, *args: Any, **kwargs: Any) -> StepMemory:
        """XLA's memory analysis of the program for ``args``, the plans it builds, and the
        bytes of arguments and outputs on one proxy's device where they follow the mesh."""
        binding, full, graph_state = self._bind(args, kwargs)
        cfg = self._config
        dyn = [full[i] for i in binding.dynamic() if i not in binding.graph]
        if binding.graph:
            dyn.append(graph_state)
        # Shapes only: a call would move arrays committed elsewhere onto the workers.
        dyn = _placement.abstract_off_workers(dyn, self.mesh)
        jitted: Any = self._compile(cfg, binding, check=False)  # (the same memory either way)
        ref_state = self._proxies.ref_state
        compiled = jitted.lower(*dyn, ref_state).compile()
        plans = [p for p in self._traced_plans if not p.xla]  # XLA's own: no runtime storage
        home = _placement.home(self.mesh, full)  # outputs follow onto the two-tier mesh
        outputs = (
            jax.eval_shape(jitted, *dyn, self._proxies.ref_state)[:3] if home is not None else None
        )
        arg_bytes, out_bytes = _placement.bytes_on_a_proxy(
            self._tiers, home, full, outputs, self._all_workers
        )
        return StepMemory(
            compiled.memory_analysis(),
            plans,
            self._tiers.proxies.count,
            list(self._proxies.stores.values()),
            arg_bytes,
            out_bytes,
            self._tiers.proxies.on,
        )
