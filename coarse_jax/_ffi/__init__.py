"""The binding layer: the compiled extension and one wrapper per custom call.

* `coarse_jax._ffi.extension`: loads ``_coarse_cpu`` / ``_coarse_cuda``,
  registers their FFI targets, checks a platform can run them.
* `coarse_jax._ffi.calls`: begin, push, proxy ring, worker ring, pull, each taking an
  explicit `CallSite` (plan, site, device ordinals).
* `coarse_jax._ffi.host_gather`: the in-host hand-out of the inter-host step.
* `coarse_jax._ffi.layout`: what the runtime derives from a plan (storage,
  exchange widths, optimizer state, the hosts' plan key), read from C++.

Nothing here reads the API's state (`coarse_jax.api`): arrows point down.
"""

from coarse_jax._ffi.calls import (
    Bucket,
    CallSite,
    RingUpdate,
    begin,
    device_ordinals,
    opt_count,
    proxy_ring,
    proxy_ring_from_hosts,
    proxy_ring_to_hosts,
    pull,
    push,
    token,
    vary,
    who,
    worker_ring,
)
from coarse_jax._ffi.cuda_support import CudaSupport
from coarse_jax._ffi.extension import (
    CUDA_TARGETS,
    arm_interrupt_hook,
    check_gpu_target,
    check_platform,
    cpu_module,
    cuda_module,
    has_cuda_support,
    inject_dropped_push,
    inject_stale_flags,
    live_sessions,
    runtime_module,
    runtime_stats,
    set_faults,
    set_memory_limits,
    virtual_sync_seconds,
)
from coarse_jax._ffi.host_gather import host_gather
from coarse_jax._ffi.layout import PlanLayout, host_plan_key, plan_layout
from coarse_jax._ffi.primitive import route_join, route_marker, route_split

__all__ = [
    "CUDA_TARGETS",
    "Bucket",
    "CallSite",
    "CudaSupport",
    "PlanLayout",
    "RingUpdate",
    "arm_interrupt_hook",
    "begin",
    "check_gpu_target",
    "check_platform",
    "cpu_module",
    "cuda_module",
    "device_ordinals",
    "has_cuda_support",
    "host_gather",
    "host_plan_key",
    "inject_dropped_push",
    "inject_stale_flags",
    "live_sessions",
    "opt_count",
    "plan_layout",
    "proxy_ring",
    "proxy_ring_from_hosts",
    "proxy_ring_to_hosts",
    "pull",
    "push",
    "route_join",
    "route_marker",
    "route_split",
    "runtime_module",
    "runtime_stats",
    "set_faults",
    "set_memory_limits",
    "token",
    "vary",
    "virtual_sync_seconds",
    "who",
    "worker_ring",
]
