"""The calls of a `coarse.sync` step dispatched and not yet seen finished.

`Config.max_steps_in_flight` bounds them: XLA:CPU can starve a run queued
behind many others. One output leaf stands for its call: a program's outputs
are ready when every device finished it.

`DeviceOrder` keeps, on the stream-semantics CPU backend, a device's
programs in dispatch order across steps, as a GPU runs them. XLA:CPU runs
two programs that share no buffer at once, each device's part as a task of
one thread pool, while the streams backend gives each device one in-order
stream that every program's calls enqueue on, and drains it before a call
returns (the host's stand-in for XLA's next kernel waiting in stream order).
A call of one program then waited for another program's work: a pull's
wait for its proxy's flag, which needs a push of a device whose task found
every pool thread taken by such waits (a 1-worker step dispatched between
two calls of an 8-worker step with a proxy in host memory timed out that
way, every time). On a GPU the launches of a device's programs are in
dispatch order and nothing of them holds a host thread, so this order is
the GPU's, not a restriction of it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from typing import Any, ClassVar

import jax

from coarse_jax import _ffi
from coarse_jax.config import Config

# Config.max_steps_in_flight=None per platform (0: unbounded).
DEFAULT_MAX_IN_FLIGHT = {"cpu": 2}


class DeviceOrder:
    """The latest call of any step per device, on the streams backend (see the module).

    Before a step's call, `wait_for_others` waits for the latest call of every
    other step that touches one of its devices (workers, and device proxies,
    whose runtime streams the programs share too); `note` records the call.
    ``own_calls``: the step's own calls wait for one another too. Only a
    stream's flag wait blocks it on work not yet enqueued (a pull's, for a
    proxy in host memory: every other stream wait is for an event already
    recorded), so that is where two calls of one step that share no buffer
    formed the same wait (sequence 33 under chaos 7, once); a step with
    device proxies keeps `InFlight`'s bound (`Config.max_steps_in_flight`),
    its calls overlapping as on a GPU. A call with no array output is not
    recorded (nothing stands for it).
    """

    # Per device id, the step's serial and one output leaf of its latest call: process-wide.
    _last: ClassVar[dict[int, tuple[int, jax.Array]]] = {}
    _serials: ClassVar[itertools.count[int]] = itertools.count(1)

    def __init__(self, devices: list[Any], own_calls: bool = False) -> None:
        self._ids = sorted({int(d.id) for d in devices})
        self._own_calls = own_calls
        self._on = bool(devices) and devices[0].platform == "cpu" and _streams_backend()
        self._serial = next(self._serials)

    def wait_for_others(self) -> None:
        if not self._on:
            return
        for i in self._ids:
            last = self._last.get(i)
            if last is None or (last[0] == self._serial and not self._own_calls):
                continue
            self._last.pop(i, None)
            if not last[1].is_deleted():  # donated to a later call: that one waits for it
                # A failed call raises where its caller reads it, not here.
                with contextlib.suppress(Exception):
                    last[1].block_until_ready()

    def note(self, out: Any) -> None:
        if not self._on:
            return
        leaf = standing_leaf(out)
        if leaf is not None:
            for i in self._ids:
                self._last[i] = (self._serial, leaf)


def _streams_backend() -> bool:
    return str(_ffi.cpu_module().backend()) == "streams"


def standing_leaf(out: Any) -> jax.Array | None:
    """The output leaf that stands for a call (its smallest array), or None: a program's
    outputs are ready when every device finished it."""
    leaves = [x for x in jax.tree.leaves(out) if isinstance(x, jax.Array)]
    if not leaves:
        return None
    return min(leaves, key=lambda x: x.size) if len(leaves) > 1 else leaves[0]


class InFlight:
    """One output leaf per call not known to be finished, oldest first, and the latest call's."""

    def __init__(self, platform: str) -> None:
        self._platform = platform
        self._queue: collections.deque[jax.Array] = collections.deque()
        # One output of the latest call, for wait_all (steps with stores, or tracing).
        self._last: jax.Array | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def limit(self, cfg: Config) -> int:
        """The most calls left unfinished (0: unbounded)."""
        if cfg.max_steps_in_flight is not None:
            return cfg.max_steps_in_flight
        return DEFAULT_MAX_IN_FLIGHT.get(self._platform, 0)

    def make_room(self, cfg: Config) -> None:
        """Before a call's dispatch: waits for the oldest calls until fewer than ``cfg``'s limit
        are unfinished, so that with the call at most the limit are.

        Before, not after: on a host with few cores the Python that follows a
        dispatch competes with the program it started (a 1 MiB all_reduce
        ran 30-45 us of it at a fraction of a core), so the waiting is done
        while nothing of this call runs yet.
        """
        limit = self.limit(cfg)
        while limit and len(self._queue) >= limit:
            oldest = self._queue.popleft()
            if oldest.is_deleted():  # donated to a later call: that call waits for it
                continue
            # Waiting only bounds the queue: a failed call raises where the
            # caller reads its outputs, not again at a later call.
            with contextlib.suppress(Exception):
                oldest.block_until_ready()

    def add(self, cfg: Config, out: Any, keep_last: bool) -> None:
        """Records the call that returned ``out``: one output leaf, its smallest, stands for it.

        ``keep_last``: `wait_all` waits for this call too. Only steps whose
        proxies hold state, or that trace, ask for it: kept by every step, it
        would keep each one's last output alive.
        """
        limit = self.limit(cfg)
        if not limit and not keep_last:
            return
        smallest = standing_leaf(out)
        if smallest is None:
            return
        if keep_last:
            self._last = smallest
        if limit:
            self._queue.append(smallest)

    def wait_all(self) -> None:
        """Blocks until every call dispatched so far finished (errors are the caller's)."""
        for x in [*self._queue, self._last]:
            if x is not None and not x.is_deleted():
                with contextlib.suppress(Exception):
                    x.block_until_ready()
