"""Analytic performance models of gradient synchronization (pure Python, no JAX).

So the planner and the benchmarks can reason about a configuration without
running it:

* `coarse_jax.perf_model.paper`: the COARSE paper's dual-synchronization estimate
  (`t_train`, `best_split`) and the pipelined proxy path against a centralized
  parameter server (`coarse_sync_s`, `dense_sync_s`).
* `coarse_jax.perf_model.dag`: the DAG model of S-SGD with wait-free
  backpropagation, chained over iterations (`dag_iterations_s`).
* `predict_plan_sync_s`: the runtime's own schedule on emulated links, piece
  by piece, equal to the virtual clock's time; it lives with the emulated
  interconnect (`coarse_jax.emulation.schedule`) and is re-exported here.
* `coarse_jax.perf_model.bound`: the floor the links alone set under it (`link_bound`).
* `coarse_jax.perf_model.hosts`: the hierarchical step across hosts (`predict_hosts_sync_s`).

Units: bytes, GB/s (1e9 bytes/s, per direction), microseconds for latencies and
seconds for every returned time. A bandwidth may be ``math.inf`` (a link that
costs nothing), which is how the extremes of the model are probed.
"""

from coarse_jax.emulation.schedule import predict_plan_sync_s
from coarse_jax.perf_model.bound import LinkBound, link_bound
from coarse_jax.perf_model.dag import Layer, dag_iteration_s, dag_iterations_s
from coarse_jax.perf_model.hosts import inter_host_bytes, predict_hosts_sync_s
from coarse_jax.perf_model.paper import (
    best_split,
    coarse_sync_s,
    dense_sync_s,
    leading_bytes_for,
    ring_allreduce_s,
    t_sync_gpu,
    t_sync_proxy,
    t_train,
)

__all__ = [
    "Layer",
    "LinkBound",
    "best_split",
    "coarse_sync_s",
    "dag_iteration_s",
    "dag_iterations_s",
    "dense_sync_s",
    "inter_host_bytes",
    "leading_bytes_for",
    "link_bound",
    "predict_hosts_sync_s",
    "predict_plan_sync_s",
    "ring_allreduce_s",
    "t_sync_gpu",
    "t_sync_proxy",
    "t_train",
]
