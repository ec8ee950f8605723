"""The DAG model of S-SGD with wait-free backpropagation.

Shi et al., "A DAG Model of Synchronous Stochastic Gradient Descent in
Distributed Deep Learning": per-layer forward, backward and communication
tasks; a layer's gradient is communicated as soon as its backward finishes.
`dag_iterations_s` also chains iterations, so the forward of layer ``l`` waits
for the sync of layer ``l`` from the previous iteration -- the dependency that
makes prioritizing the leading layers pay off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coarse_jax.perf_model._checks import check_nonneg


@dataclass(frozen=True)
class Layer:
    """Per-layer costs of one training iteration on one worker.

    Example:
      >>> coarse.perf_model.Layer("fc", fwd_s=0.001, bwd_s=0.002, grad_bytes=4_000_000).grad_bytes
      4000000

    Attributes:
      name: Label, for reporting only.
      fwd_s: Forward computation seconds.
      bwd_s: Backward computation seconds.
      grad_bytes: Gradient bytes to synchronize (0 for parameter-free layers,
        which then need no communication task).
    """

    name: str
    fwd_s: float
    bwd_s: float
    grad_bytes: int

    def __post_init__(self) -> None:
        check_nonneg(self.fwd_s, f"Layer {self.name!r}: fwd_s")
        check_nonneg(self.bwd_s, f"Layer {self.name!r}: bwd_s")
        check_nonneg(self.grad_bytes, f"Layer {self.name!r}: grad_bytes")


def dag_iteration_s(
    layers: Sequence[Layer],
    comm_s: Callable[[int], float],
    *,
    overlap: bool = True,
    worker_layers: int = 0,
    worker_comm_s: Callable[[int], float] | None = None,
) -> float:
    """Predicted time of one S-SGD iteration from per-layer costs.

    Compute is one serial resource: forward of layers ``0..L-1``, then backward
    of ``L-1..0``. Layer ``l``'s gradient is ready when its backward finishes
    (wait-free backpropagation). Each communication channel is another serial
    resource that takes gradients in the order they become ready (so backward
    order), each lasting ``comm_s(grad_bytes)``. The iteration ends when the
    backward pass and every communication are done.

    Dual synchronization: the first ``worker_layers`` layers (the leading ones)
    go on a second, independent channel with cost ``worker_comm_s`` -- the
    worker ring -- and the rest on the proxy channel with ``comm_s``. The two
    channels share nothing, so they run concurrently.

    Args:
      layers: Layers in forward order.
      comm_s: Seconds to synchronize a gradient of the given byte size on the
        proxy (main) channel.
      overlap: If False, no communication starts before the whole backward
        pass is done (the non-WFBP baseline).
      worker_layers: How many leading layers use the worker channel.
      worker_comm_s: Cost function of the worker channel; required when
        ``worker_layers > 0``.

    Returns:
      Seconds from the start of the forward pass to the end of the iteration.

    Raises:
      ValueError: On an invalid ``worker_layers``/``worker_comm_s``.

    Example:
      >>> from coarse_jax.perf_model import Layer
      >>> layers = [Layer("conv", 0.002, 0.004, 4_000_000), Layer("fc", 0.001, 0.002, 8_000_000)]
      >>> comm = lambda nbytes: nbytes / 4e9                     # 4 GB/s, seconds
      >>> round(coarse.perf_model.dag_iteration_s(layers, comm) * 1e3, 3)          # ms, overlapped
      10.0
      >>> round(coarse.perf_model.dag_iteration_s(layers, comm, overlap=False) * 1e3, 3)
      12.0
    """
    return dag_iterations_s(
        layers,
        comm_s,
        1,
        overlap=overlap,
        worker_layers=worker_layers,
        worker_comm_s=worker_comm_s,
    )


def dag_iterations_s(
    layers: Sequence[Layer],
    comm_s: Callable[[int], float],
    steps: int,
    *,
    overlap: bool = True,
    worker_layers: int = 0,
    worker_comm_s: Callable[[int], float] | None = None,
) -> float:
    """Predicted total time of ``steps`` consecutive S-SGD iterations.

    Each iteration is scheduled as in :func:`dag_iteration_s`; across
    iterations the forward of layer ``l`` in iteration ``t+1`` also waits for
    the synchronization of layer ``l`` from iteration ``t`` (its parameters are
    updated with the reduced gradient). Because the backward pass finishes with
    layer 0, whose gradient is then synchronized *last* on a FIFO channel, the
    next forward pass stalls on it; putting the leading layers on their own
    channel (``worker_layers``) is what removes that stall. The optimizer
    update is folded into the communication cost.

    Args:
      layers: Layers in forward order.
      comm_s: Seconds to synchronize a gradient of the given byte size on the
        proxy (main) channel.
      steps: Number of iterations (>= 1).
      overlap: If False, an iteration's communications start only after its
        whole backward pass.
      worker_layers: How many leading layers use the worker channel.
      worker_comm_s: Cost function of the worker channel; required when
        ``worker_layers > 0``.

    Returns:
      Seconds from the first forward to the end of the last iteration's
      backward pass and communications; 0 for an empty model.

    Raises:
      ValueError: On ``steps < 1`` or an invalid ``worker_layers``/``worker_comm_s``.

    Example:
      >>> from coarse_jax.perf_model import Layer
      >>> layers = [Layer("conv", 0.002, 0.004, 4_000_000), Layer("fc", 0.001, 0.002, 8_000_000)]
      >>> comm = lambda nbytes: nbytes / 4e9                     # 4 GB/s, seconds
      >>> round(coarse.perf_model.dag_iterations_s(layers, comm, steps=3) * 1e3, 3)  # ms
      30.0
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    num = len(layers)
    if not 0 <= worker_layers <= num:
        raise ValueError(f"worker_layers must be in [0, {num}], got {worker_layers!r}.")
    if worker_layers > 0 and worker_comm_s is None:
        raise ValueError("worker_comm_s is required when worker_layers > 0.")

    compute = 0.0  # when the compute resource is next free
    channel_free = [0.0, 0.0]  # [proxy channel, worker channel]
    synced = [0.0] * num  # when layer l's last gradient sync ended
    end = 0.0
    for _ in range(steps):
        for l, layer in enumerate(layers):
            compute = max(compute, synced[l]) + layer.fwd_s
        ready: list[tuple[int, float]] = []  # (layer, gradient-ready time), backward order
        for l in range(num - 1, -1, -1):
            compute += layers[l].bwd_s
            ready.append((l, compute))
        end = max(end, compute)
        for l, t_ready in ready:
            nbytes = layers[l].grad_bytes
            if nbytes == 0:
                synced[l] = t_ready  # nothing to synchronize
                continue
            # Without overlap every sync waits for the end of the backward pass.
            start = t_ready if overlap else compute
            ch = 1 if l < worker_layers else 0
            cost = (worker_comm_s if ch else comm_s)(nbytes)  # type: ignore[misc]
            check_nonneg(cost, f"communication time of layer {layers[l].name!r}")
            channel_free[ch] = max(channel_free[ch], start) + cost
            synced[l] = channel_free[ch]
            end = max(end, synced[l])
    return end
