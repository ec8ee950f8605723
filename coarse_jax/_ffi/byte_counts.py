"""The bytes the CPU runtime moves, counted where it moves them (issue 39).

Every device operation of the CPU backend adds the bytes its loop reads and
writes to a process-wide counter of its kind (``ffi/runtime/traffic.h``):

* ``gather``: leaves widened into f32 storage (a copying push; the worker
  ring's scratch on emulated links);
* ``scatter``: f32 storage narrowed into leaves (a pull, the leading
  layers' outputs);
* ``sum``: the proxies' sums (in place from the pushes, or over their
  slots) and the workers' one-pass sums of the leading layers;
* ``ring_step``: one peer's chunk added or copied (the rings on emulated
  links);
* ``scale``: a separate scaling pass;
* ``optimizer``: the proxies' optimizer;
* ``check``: the params check and the global norm's sum of squares;
* ``bytes``: plain copies and zero fills (tokens, pass-through outputs).

XLA's own work (the step's program, ``lax.psum``) is not counted, nor are
the streams backend's and CUDA's operations. `counted` brackets some code and
reports what it moved, to hold against `coarse_jax.plan.traffic`'s
prediction and the minimum a shared-memory reduction needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from coarse_jax._ffi.extension import cpu_module


@dataclasses.dataclass
class Traffic:
    """Bytes read and written by the CPU runtime's device operations.

    Attributes:
      by_op: per kind of operation (module docstring), (bytes read, bytes written).
    """

    by_op: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    @property
    def read(self) -> int:
        """Bytes read, all operations."""
        return sum(r for r, _ in self.by_op.values())

    @property
    def written(self) -> int:
        """Bytes written, all operations."""
        return sum(w for _, w in self.by_op.values())


@contextlib.contextmanager
def counted() -> Iterator[Traffic]:
    """Counts the CPU runtime's bytes inside the ``with`` block.

    The counters are the process's: work of other threads' syncs in the block
    is counted too, so run one sync at a time. The result is filled in on exit
    (finish the sync inside the block, e.g. with ``jax.block_until_ready``).

    Example:
      >>> from coarse_jax._ffi.byte_counts import counted
      >>> with counted() as t:
      ...     pass
      >>> (t.read, t.written)
      (0, 0)
    """
    module = cpu_module()
    before = module.traffic()
    result = Traffic()
    try:
        yield result
    finally:
        after = module.traffic()
        for op, (r1, w1) in after.items():
            r0, w0 = before[op]
            if r1 != r0 or w1 != w0:
                result.by_op[op] = (int(r1 - r0), int(w1 - w0))
