"""What the runtime asks of its streams (``ffi/runtime/stream_ops.h``), counted per kind.

Every call the orchestration makes on a stream, on CUDA and on the CPU's
streams, goes through one counting layer, so a count taken on the
stream-semantics CPU backend (``COARSE_JAX_BACKEND=streams``) describes what a
GPU would be asked to do. The default CPU backend's inline stream counts its
launches, records and waits too, but copies nothing between devices (one
address space) and never waits on the host.
Process-wide and cumulative, summed over the CPU and CUDA runtimes;
`coarse_jax.testing.stream_ops` is the public reader.
"""

from __future__ import annotations

import dataclasses

from coarse_jax._ffi.extension import _modules, cpu_module, summed_counters
from coarse_jax._ffi.wakeups import wakeup_stats


@dataclasses.dataclass(frozen=True)
class StreamOps:
    """Counts since the last `reset_stream_ops`.

    Attributes:
      launches: kernels and memsets enqueued (pack, unpack, reduce, the
        optimizer, the sum of squares, the params check, memset).
      copies_d2d, copies_peer, copies_d2h, copies_h2d: copies enqueued, by
        direction: within one device, device to device, device to host
        (Download, or a copy into a proxy in host memory), host to device
        (Upload, UploadPinned, or a copy out of a proxy in host memory).
      bytes_d2d, bytes_peer, bytes_d2h, bytes_h2d: their bytes.
      records: event records.
      stream_waits: a stream made to wait, for an event or for a host flag.
      host_waits: the host waiting for device work (a proxy in host memory
        waiting for a worker's copy).
      host_syncs: the host waiting for a whole stream (a blocking read).
      table_uploads: of ``copies_h2d``, the span tables uploaded (a merged
        pack or unpack whose table none of the device's resident tables
        held; a step's tables repeat where its leaves' buffers stay put).
      hand_offs: runtime threads woken by another thread's progress (the
        wake-ups of ``coarse_jax._ffi.wakeups``: ``notify_sleeper``).
    """

    launches: int = 0
    copies_d2d: int = 0
    copies_peer: int = 0
    copies_d2h: int = 0
    copies_h2d: int = 0
    bytes_d2d: int = 0
    bytes_peer: int = 0
    bytes_d2h: int = 0
    bytes_h2d: int = 0
    records: int = 0
    stream_waits: int = 0
    host_waits: int = 0
    host_syncs: int = 0
    table_uploads: int = 0
    hand_offs: int = 0

    @property
    def copies(self) -> int:
        """Copies of every direction."""
        return self.copies_d2d + self.copies_peer + self.copies_d2h + self.copies_h2d

    def __sub__(self, other: StreamOps) -> StreamOps:
        return StreamOps(
            **{
                f.name: getattr(self, f.name) - getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    def per(self, n: int) -> dict[str, float]:
        """Each count divided by ``n`` (steps, say)."""
        return {f.name: getattr(self, f.name) / n for f in dataclasses.fields(self)}


_hand_off_base = 0


def stream_ops() -> StreamOps:
    """The counts now, summed over the loaded runtimes."""
    woken = wakeup_stats().notify_sleeper - _hand_off_base
    return StreamOps(**summed_counters("stream_ops"), hand_offs=woken)


def reset_stream_ops() -> None:
    """Zeroes the counts of every loaded runtime (the wake-up counters are left as they are)."""
    global _hand_off_base
    cpu_module()
    for module in _modules():
        module.reset_stream_ops()
    _hand_off_base = wakeup_stats().notify_sleeper


def set_ring_group_floats(floats: int) -> int:
    """Testing: the most floats the proxies' ring steps as one group of pieces
    (``ffi/runtime/ring_groups.h``), in every loaded runtime; 0 steps the ring piece by
    piece (what the step budgets must catch), a negative value restores the default
    (4 MiB of f32). Returns the previous value (the CPU runtime's)."""
    before = int(cpu_module().set_ring_group_floats(int(floats)))
    for module in _modules():
        module.set_ring_group_floats(int(floats))
    return before
