"""`coarse.diagnostics.plan`: what happens to each leaf of a gradient tree.

The plan fixes, before anything runs, every decision the runtime follows:

* the dual-sync split: the first leaves of the tree (the model's first layers,
  needed first by the next forward pass) up to ``Config.leading_bytes`` are
  reduced among the workers; the rest goes through the proxies;
* the sync order: proxy leaves are pushed in backward order (last leaf first),
  which is also the one global order every proxy walks;
* pieces: a leaf larger than ``shard_bytes`` is cut into equal shards, smaller
  leaves are batched into pieces of up to ``shard_bytes``;
* routes: a piece smaller than ``latency_threshold_bytes`` goes to the worker's
  latency proxy, a larger one to its bandwidth proxy.

The runtime receives the plan as FFI attributes of each custom call
(`Plan.ffi_attrs`). Building it is linear in the number of leaves.
"""

from coarse_jax.plan.dtypes import SUPPORTED_DTYPES, check_dtype
from coarse_jax.plan.planner import auto_leading_bytes, plan
from coarse_jax.plan.types import BucketPlan, LeafPlan, PiecePlan, Plan

__all__ = [
    "SUPPORTED_DTYPES",
    "BucketPlan",
    "LeafPlan",
    "PiecePlan",
    "Plan",
    "auto_leading_bytes",
    "check_dtype",
    "plan",
]
