"""Snapshot overhead, measured in one run (issue 14): step time with snapshots vs without.

Two parameter trees at p = 4 (8 CPU devices), `coarse.value_and_update` with
`coarse.optim.adamw`:

* the bert example's encoder (examples/bert, its default size) on its own batches;
* a ResNet-50-sized tree (25.6 M parameters, `coarse_jax.cli.resnet50`) with a
  cheap synthetic loss, so the step is mostly synchronization and update and
  the snapshot's share is as large as it gets.

For each: ``Snapshots(every=K)`` for K = 0 (off), 12 and 1, writing to a
temporary directory; and, in the same run, the same training with the
optimizer on the workers (`lax.pmean` + optax) saving (params, opt_state) with
orbax's asynchronous `CheckpointManager` from the workers every K steps; and
coarse with its proxies in host memory (``proxies_on="host"``, issue 38),
unless ``COARSE_BENCH_SNAPSHOT_HOST=0`` (`make bench` sets it, to stay within
its 15 minutes: the third scheme adds half again to the longest benchmark).
Reported: mean step time over the 24 timed steps (so K = 12 includes two
snapshots), the faster of two runs in opposite orders, and the ratio to K = 0
of the same scheme; and K = 100, derived
(not measured: 100 steps of each case would take minutes here) as K = 0 plus
1/100 of the measured cost of one snapshot, (t(K=1) - t(0)).
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from baselines import pmean_optax_step
from common.clock import timed
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.cli.resnet50 import resnet50_tree

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "bert"))
from configs.default import get_config
from train import build_model, make_data, make_loss

WORKERS = 4
STEPS = 24  # timed, after 3 warm-up steps
_LINES: list[str] = []


def _resnet_case():
    rng = np.random.default_rng(0)
    params = {
        k: jnp.asarray(rng.standard_normal(s.shape) * 0.01, jnp.float32)
        for k, s in resnet50_tree().items()
    }

    def loss(params, batch):
        # Linear in every parameter: the gradient is cheap and batch-dependent.
        return sum(jnp.mean(p) for p in jax.tree.leaves(params)) * jnp.mean(batch)

    batches = [rng.standard_normal((WORKERS * 2, 8)).astype(np.float32) for _ in range(4)]
    return "resnet50 tree", params, loss, batches


def _bert_case():
    cfg = get_config()
    model = build_model(cfg)
    params = model.init(jax.random.key(0), jnp.zeros((1, cfg.seq_len), jnp.int32))
    cfg = type(cfg)(**{**cfg.__dict__, "steps": 4})
    train, _ = make_data(cfg)
    batches = [{k: v[i] for k, v in train.items()} for i in range(4)]
    return "bert example", params, make_loss(model.apply), batches


def _time(step, state, batches, warm=None):
    """Mean step time over STEPS steps after 3 warm-up steps; ``warm()`` after the
    warm-up (one snapshot or save, so first-time costs stay out of the timing)."""
    times = []
    for i in range(STEPS + 3):
        if i == 3 and warm is not None:
            jax.block_until_ready(state)
            warm()
        state, seconds = timed(step, state, batches[i % len(batches)])
        if i >= 3:
            times.append(seconds)
    return float(np.mean(times))  # a mean: the steps that snapshot count in full


def _coarse(params, loss, batches, every, directory, proxies_on="devices"):
    mesh = coarse.make_mesh(workers=WORKERS, proxies_on=proxies_on)
    snaps = coarse.Snapshots(every=every, directory=directory if every else None)
    opt = coarse.optim.adamw(1e-4, weight_decay=0.01)

    @coarse.sync(mesh, snapshots=snaps)
    def step(params, batch):
        value, params = coarse.value_and_update(loss, opt)(params, batch)
        return params, value

    def warm():
        step.snapshot()  # allocates the proxies' snapshot buffers, starts the writer
        step.wait_snapshots()

    t = _time(lambda s, b: step(s[0], b), (params, 0.0), batches, warm if every else None)
    step.wait_snapshots()
    return t


def _pmean_orbax(params, loss, batches, every, directory):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:WORKERS]), ("data",))
    tx = optax.adamw(1e-4, weight_decay=0.01)
    update = jax.jit(pmean_optax_step(WORKERS, loss, tx))

    manager = None
    if every:
        manager = ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=1)
        )
    replicated = NamedSharding(mesh, P())
    state = jax.device_put((params, tx.init(params)), replicated)
    count = [0]

    def step(state, batch):
        params, opt_state, _ = update(*state, batch)
        count[0] += 1
        if manager is not None and count[0] % every == 0:
            manager.save(count[0], args=ocp.args.StandardSave((params, opt_state)))
        return params, opt_state

    def warm():
        manager.save(0, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()

    t = _time(step, state, batches, warm if manager is not None else None)
    if manager is not None:
        manager.wait_until_finished()
    return t


def _coarse_host(params, loss, batches, every, directory):
    return _coarse(params, loss, batches, every, directory, proxies_on="host")


# The proxies in host memory (issue 38): the same snapshots, the state already
# in host memory, all 8 CPU devices free (4 used here, as the other schemes).
SCHEMES = (
    ("coarse snapshots", _coarse),
    *(
        [("coarse, host proxies", _coarse_host)]
        if os.environ.get("COARSE_BENCH_SNAPSHOT_HOST", "1") != "0"
        else []
    ),
    ("pmean + orbax", _pmean_orbax),
)


@pytest.mark.timeout(1800)  # three schemes x three settings x two orders
@pytest.mark.parametrize("case", [_resnet_case, _bert_case], ids=["resnet50", "bert"])
def test_snapshot_overhead(case, benchmark):
    name, params, loss, batches = case()
    rows = {}

    def measure():
        # Twice, in opposite orders, keeping each setting's faster mean: the
        # first runs of a process pay first-touch costs the later ones do not.
        for order in ((0, 12, 1), (1, 12, 0)):
            for scheme, fn in SCHEMES:
                for every in order:
                    with tempfile.TemporaryDirectory() as d:
                        t = fn(params, loss, batches, every, d)
                    rows[(scheme, every)] = min(t, rows.get((scheme, every), t))
                    # A step and its compiled program reference each other: collect
                    # them now, with the proxies' state they hold (GBs for ResNet-50).
                    gc.collect()

    benchmark.pedantic(measure, rounds=1, iterations=1)
    n = sum(x.size for x in jax.tree.leaves(params))
    _LINES.append(f"{name} ({n / 1e6:.1f} M params), {WORKERS} workers, mean of {STEPS} steps:")
    for scheme, _ in SCHEMES:
        base = rows[(scheme, 0)]
        parts = [f"off {base * 1e3:.1f} ms"]
        for every in (12, 1):
            t = rows[(scheme, every)]
            parts.append(f"every {every}: {t * 1e3:.1f} ms ({t / base - 1:+.1%})")
        derived = (rows[(scheme, 1)] - base) / 100
        parts.append(f"every 100 (derived): {derived / base:+.2%}")
        _LINES.append(f"  {scheme:<20} " + ", ".join(parts))
    print("\n" + "\n".join(_LINES))


def _mlp_case():
    rng = np.random.default_rng(1)
    params = {
        "w1": jnp.asarray(rng.standard_normal((8, 16)) * 0.3, jnp.float32),
        "b1": jnp.zeros((16,), jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((16, 4)) * 0.3, jnp.float32),
    }

    def loss(params, batch):
        h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)

    batches = [
        {
            "x": rng.standard_normal((WORKERS * 2, 8)).astype(np.float32),
            "y": rng.standard_normal((WORKERS * 2, 4)).astype(np.float32),
        }
        for _ in range(4)
    ]
    return "test MLP", params, loss, batches


WRITES = 5


@pytest.mark.parametrize(
    "case", [_mlp_case, _bert_case, _resnet_case], ids=["mlp", "bert", "resnet50"]
)
def test_snapshot_write_time(case, benchmark):
    """Time from a snapshot being taken to it being complete on disk (issue 24), median of
    WRITES: coarse_jax's writer (one orbax checkpointer for all writes) against the same
    checkpoint written with a new ``StandardCheckpointer`` per save (the writer before),
    same run."""
    from coarse_jax.api import snapshots

    name, params, loss, batches = case()
    mesh = coarse.make_mesh(workers=WORKERS)
    opt = coarse.optim.adamw(1e-4, weight_decay=0.01)
    rows: dict[str, float] = {}

    def measure():
        with tempfile.TemporaryDirectory() as d:
            snaps = coarse.Snapshots(every=10_000, directory=os.path.join(d, "ck"))

            @coarse.sync(mesh, snapshots=snaps)
            def step(params, batch):
                value, params = coarse.value_and_update(loss, opt)(params, batch)
                return params, value

            p = params
            times = []
            for i in range(WRITES + 1):
                p, _ = step(p, batches[i % len(batches)])
                step.snapshot()
                step.wait_snapshots()
                if i:  # the first write pays the checkpointer's creation
                    times.append(step.stats()["snapshot_write_s"])
            rows["coarse_jax writer"] = float(np.median(times))
            (store,) = step._proxies.stores.values()
            exported = store.runtime.export(snapshot=True)
            assert exported is not None, "the step took snapshots"
            count, leaves, values = exported
            tree = snapshots.to_trees(store, count, store.slot_leaves(leaves, values))

            def save_fresh(path):
                checkpointer = ocp.StandardCheckpointer()
                checkpointer.save(path, tree)
                checkpointer.wait_until_finished()

            fresh = [timed(save_fresh, os.path.join(d, f"fresh{i}"))[1] for i in range(WRITES)]
            rows["new checkpointer per save"] = float(np.median(fresh))
            del step
            gc.collect()

    benchmark.pedantic(measure, rounds=1, iterations=1)
    n = sum(x.size for x in jax.tree.leaves(params))
    base = rows["new checkpointer per save"]
    _LINES.append(
        f"{name} ({n / 1e6:.2f} M params): taken -> on disk, median of {WRITES}: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in rows.items())
        + f" (ratio {rows['coarse_jax writer'] / base:.2f})"
    )
    print("\n" + "\n".join(_LINES))
