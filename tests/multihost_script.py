"""One process of the multi-host tests (tests/test_multihost.py), run by coarse_jax.launch.

``python -m coarse_jax.launch --processes 2 --devices-per-process 8 tests/multihost_script.py
SCENARIO``. Each scenario prints ``RESULT <json>`` lines the test reads, and
checks what one process can check itself (an assertion fails the process,
which fails the launch).

* ``sync``: value_and_grad and all_reduce (ffi and reference, with and
  without leading layers) against the float64 mean over all workers of all
  processes; twice, bitwise equal; a digest of the results per process.
* ``optax``: 20 optax steps against a ``lax.pmean`` step over the same workers.
* ``update``: 20 `coarse.value_and_update` steps (adam; adamw + clipping on
  DENSE routes; sgd + momentum on crossing routes), ffi and reference, against
  ``lax.pmean`` + the optax chain over the same workers; different plans on
  the two processes are refused.
* ``snapshots DIR``: process 0 writes the proxies' snapshots; a fresh step on
  every process restores from DIR and ends bitwise where the first run ended.
* ``missing``: process 1 never calls the step; process 0 must fail naming it.
* ``dropped``: after a healthy step, each host loses one worker's push (host 0
  its first worker, the last host its last); each must fail naming exactly
  that worker.
"""

import dataclasses
import hashlib
import json
import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from helpers import make_batch, mlp_init, mlp_loss, per_worker_mean
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.launch import initialize
from coarse_jax.mesh import proxies_of, two_tier_mesh, workers_mesh
from coarse_jax.testing import active_backend, xla_hand_out

P_LOCAL = 4
# COARSE_TEST_PROXIES=q: q proxies per host, each shared by P_LOCAL / q workers.
Q_LOCAL = int(os.environ.get("COARSE_TEST_PROXIES", P_LOCAL))
# COARSE_TEST_PROXIES_ON=host: the proxies in host memory (make_mesh's proxies_on).
PROXIES_ON = os.environ.get("COARSE_TEST_PROXIES_ON", "devices")


def result(name, value):
    print("RESULT " + json.dumps({"name": name, "process": jax.process_index(), "value": value}))


def digest(tree) -> str:
    h = hashlib.sha256()
    for x in jax.tree.leaves(tree):
        h.update(np.asarray(x).tobytes())
    return h.hexdigest()[:16]


def global_batch(mesh, batch):
    """The process's rows of the global batch, as one array split over ("host", "data")."""
    n = jax.tree.leaves(batch)[0].shape[0] // jax.process_count()
    lo = jax.process_index() * n
    # Over the workers: a COARSE k:1 mesh lists each shared proxy k times, and
    # jax cannot split an array over a mesh that repeats a device.
    workers = workers_mesh(mesh) if "tier" in mesh.axis_names else mesh
    sharding = NamedSharding(workers, P(("host", "data")))
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x[lo : lo + n])),
        batch,
    )


def close(actual, expected, rtol):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        e = np.asarray(e, np.float64)
        atol = rtol * (np.max(np.abs(e)) if e.size else 0.0)
        np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=rtol, atol=atol)


def scenario_sync(mesh):
    workers = P_LOCAL * jax.process_count()
    params = jax.tree.map(np.asarray, mlp_init(jax.random.key(0), (7, 13, 5, 1)))
    batch = make_batch(jax.random.key(1), 4 * workers, 7, 1)
    want_loss, want_grads = per_worker_mean(mlp_loss, params, batch, workers)
    gbatch = global_batch(mesh, batch)
    digests = {}
    for mode in ("ffi", "reference"):
        for leading in (0, 7 * 13 * 4 + 13 * 4):
            cfg = coarse.Config(mode=mode, shard_bytes=64, leading_bytes=leading, timeout_s=60)

            @coarse.sync(mesh, config=cfg)
            def step(params, batch):
                loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
                summed = coarse.all_reduce(batch["x"].sum(0), op="sum")
                y = batch["y"].mean(0)
                mean = coarse.all_reduce({"y": y, "y16": y.astype(jnp.bfloat16)})
                return loss, grads, summed, mean

            first = step(params, gbatch)
            second = step(params, gbatch)
            loss, grads, summed, mean = first
            np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
            close(grads, want_grads, 1e-6)
            x = np.asarray(batch["x"], np.float64)
            close(summed, x.sum(0), 1e-5)
            close(mean["y"], np.asarray(batch["y"], np.float64).mean(0), 1e-5)
            assert mean["y16"].dtype == jnp.bfloat16
            close(mean["y16"], np.asarray(batch["y"], np.float64).mean(0), 2e-2)
            assert digest(first) == digest(second), f"{mode}/{leading}: not bitwise reproducible"
            # Every local device holds the same bytes (the outputs are replicated).
            for leaf in jax.tree.leaves(first):
                shards = [np.asarray(s.data) for s in leaf.addressable_shards]
                assert all(np.array_equal(shards[0], s) for s in shards), "devices differ"
            digests[f"{mode}/{leading}"] = digest(first)
            if mode == "ffi" and not leading:
                # Arguments replicated over the mesh (every process puts the same
                # values): the workers; the outputs stay there and mix with them.
                on_mesh = NamedSharding(mesh, P())
                again = step(jax.device_put(params, on_mesh), jax.device_put(batch, on_mesh))
                assert digest(again) == digest(first), "arguments on the mesh differ"
                on_workers = set(mesh.devices.flat)
                assert all(x.sharding.device_set == on_workers for x in jax.tree.leaves(again))
                if PROXIES_ON == "devices":
                    # Code written for the two-tier mesh: at k:1 it lists a device
                    # twice and the step copies one replica onto the workers; the
                    # outputs follow onto the whole mesh (as jax.jit's would), so they
                    # mix with the arguments in another jitted function.
                    full = two_tier_mesh(mesh)
                    on_full = NamedSharding(full, P())
                    old = coarse.sync(step.__wrapped__, mesh=full, config=cfg)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # LegacyPlacement, tested on one host
                        again = old(jax.device_put(params, on_full), jax.device_put(batch, on_full))
                    assert digest(again) == digest(first), "arguments on the two tiers differ"
                    everything = set(full.devices.flat)
                    assert all(x.sharding.device_set == everything for x in jax.tree.leaves(again))
                    moved = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - b, p, g))(
                        jax.device_put(params, on_full), again[1]
                    )
                    assert all(x.sharding.device_set == everything for x in jax.tree.leaves(moved))
            if mode == "ffi":
                # The XLA in-host hand-out (what GPUs use) gives the same bytes.
                with xla_hand_out():
                    again = coarse.sync(step.__wrapped__, mesh=mesh, config=cfg)(params, gbatch)
                assert digest(again) == digest(first), f"XLA hand-out differs ({leading})"
                # Emulated links (real and virtual clock) change timing only:
                # the inter-host link's charge in coarse_host_gather finds the
                # host's synchronization of every site and the bytes are equal.
                # They run on the default backend only (their clock times
                # operations that finish when they return), not under streams.
                streams = active_backend("cpu") == "streams"
                for clock in () if streams else ("real", "virtual"):
                    topo = coarse.Topology.preset("v100", P_LOCAL, proxies=Q_LOCAL, clock=clock)
                    emu = dataclasses.replace(cfg, topology=topo)
                    again = coarse.sync(step.__wrapped__, mesh=mesh, config=emu)(params, gbatch)
                    assert digest(again) == digest(first), f"emulated {clock} differs ({leading})"
    # Inside lax.fori_loop: one site, three iterations (the runtime's
    # sessions and the in-host hand-out count iterations per device).
    rows = np.asarray(batch["x"], np.float64).reshape(workers, -1, 7)

    @coarse.sync(mesh, config=coarse.Config(timeout_s=60))
    def looped(batch):
        def body(i, acc):
            return acc + coarse.all_reduce(batch["x"][0] * (i + 1).astype(jnp.float32))

        return lax.fori_loop(0, 3, body, jnp.zeros((7,), jnp.float32))

    # Blocked on every device's copy (reading one waits for one device only).
    close(jax.block_until_ready(looped(gbatch)), 6 * rows[:, 0].mean(0), 1e-5)
    # Every in-host hand-out was left by all its devices and removed.
    assert coarse._ffi.cpu_module().live_hand_outs() == 0
    result("digests", digests)
    result("ok", "sync")


def worker_mesh(mesh):
    """The workers of every host as one ("host", "data") mesh (the pmean baseline's)."""
    return jax.sharding.Mesh(workers_mesh(mesh).devices[:, 0, :], ("host", "data"))


def pmean_optax_step(wmesh, tx):
    """The oracle: jax.value_and_grad + lax.pmean over all workers + the optax update."""
    import optax

    axes = ("host", "data")

    def body(params, opt_state, batch):
        varying = lax.pcast(params, axes, to="varying")
        loss, grads = jax.value_and_grad(mlp_loss)(varying, batch)
        grads, loss = lax.pmean((grads, loss), axes)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(jax.shard_map(body, mesh=wmesh, in_specs=(P(), P(), P(axes)), out_specs=P()))


def scenario_optax(mesh):
    import optax

    workers = P_LOCAL * jax.process_count()
    params = jax.tree.map(np.asarray, mlp_init(jax.random.key(2), (6, 16, 3)))
    opt = optax.adam(1e-2)

    @coarse.sync(mesh, config=coarse.Config(shard_bytes=128, timeout_s=60))
    def coarse_step(params, opt_state, batch):
        loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # The baseline: the same workers, lax.pmean over ("host", "data") of the workers only.
    wmesh = worker_mesh(mesh)
    base_step = pmean_optax_step(wmesh, opt)
    c_params, c_state = params, opt.init(params)
    b_params, b_state = params, opt.init(params)
    losses = []
    for i in range(20):
        batch = make_batch(jax.random.key(100 + i), 2 * workers, 6, 3)
        c_params, c_state, c_loss = coarse_step(c_params, c_state, global_batch(mesh, batch))
        b_params, b_state, b_loss = base_step(b_params, b_state, global_batch(wmesh, batch))
        losses.append((float(c_loss), float(b_loss)))
    for c, b in losses:
        np.testing.assert_allclose(c, b, rtol=1e-5)
    close(c_params, b_params, 1e-5)
    assert losses[-1][0] < losses[0][0], f"loss did not go down: {losses}"
    result("losses", losses)
    result("params_digest", digest(c_params))

    result("ok", "optax")


def update_cases():
    """name -> (coarse optimizer, the optax chain written out independently, Config fields)."""
    import optax

    return {
        "adam": (coarse.optim.adam(1e-2), optax.adam(1e-2), {"shard_bytes": 128}),
        "adamw_clip_dense": (
            coarse.optim.adamw(1e-2, weight_decay=0.1, clip_norm=0.5),
            optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1)),
            {"shard_bytes": 256, "routes": tuple((0, 0) for _ in range(P_LOCAL))},
        ),
        "sgd_momentum_crossing": (
            coarse.optim.sgd(5e-2, momentum=0.9),
            optax.sgd(5e-2, momentum=0.9),
            {
                "shard_bytes": 64,
                "routes": tuple(
                    (i * Q_LOCAL // P_LOCAL, (i + 1) % Q_LOCAL) for i in range(P_LOCAL)
                ),
            },
        ),
    }


def scenario_update(mesh):
    """coarse.value_and_update across hosts (ffi and reference) against lax.pmean + optax
    over all workers: the proxies of every host update from the mean over all hosts."""
    workers = P_LOCAL * jax.process_count()
    wmesh = worker_mesh(mesh)
    params0 = jax.tree.map(np.asarray, mlp_init(jax.random.key(2), (6, 16, 3)))
    digests = {}
    for name, (opt, tx, cfg) in update_cases().items():
        base_step = pmean_optax_step(wmesh, tx)
        for mode in ("ffi", "reference"):
            config = coarse.Config(mode=mode, timeout_s=60, **cfg)

            @coarse.sync(mesh, config=config)
            def step(params, batch, opt=opt):
                loss, params = coarse.value_and_update(mlp_loss, opt)(params, batch)
                return params, loss

            c_params, b_params, b_state = params0, params0, tx.init(params0)
            c_losses, b_losses = [], []
            for i in range(20):
                batch = make_batch(jax.random.key(300 + i), 2 * workers, 6, 3)
                c_params, c_loss = step(c_params, global_batch(mesh, batch))
                b_params, b_state, b_loss = base_step(b_params, b_state, global_batch(wmesh, batch))
                c_losses.append(c_loss)
                b_losses.append(b_loss)
            c_losses = [float(x) for x in c_losses]
            b_losses = [float(x) for x in b_losses]
            np.testing.assert_allclose(c_losses, b_losses, rtol=1e-5, err_msg=f"{name}/{mode}")
            close(c_params, b_params, 1e-5)
            assert c_losses[-1] < c_losses[0], (name, mode, c_losses)
            # The proxies' state is optax's, on every host.
            close(jax.tree.leaves(step.optimizer_state()), jax.tree.leaves(b_state), 1e-4)
            digests[f"{name}/{mode}"] = digest((c_params, c_losses))
    result("update_digests", digests)

    # Processes with different plans: every process refuses the step before it
    # runs (coarse_jax/dispatch/arrival.py same_plans; the chunks they sum would not
    # line up), so none waits in an inter-host collective for one that stopped.
    shard = 128 if jax.process_index() == 0 else 64

    @coarse.sync(mesh, config=coarse.Config(shard_bytes=shard, timeout_s=20))
    def mismatched(params, batch):
        loss, params = coarse.value_and_update(mlp_loss, coarse.optim.sgd(1e-2))(params, batch)
        return params, loss

    batch = global_batch(mesh, make_batch(jax.random.key(9), 2 * workers, 6, 3))
    try:
        jax.block_until_ready(mismatched(params0, batch))
    except Exception as err:  # the message is what is checked
        result("mismatch", str(err)[:2000])
    else:
        result("mismatch", None)
    result("ok", "update")  # and exits cleanly: the refused step never ran


def scenario_snapshots(mesh):
    """Process 0 writes the proxies' snapshots across hosts; a fresh step on every
    process restores from the directory and ends bitwise where the first run ended."""
    from coarse_jax import _jax_compat

    workers = P_LOCAL * jax.process_count()
    directory = sys.argv[2]
    params0 = jax.tree.map(np.asarray, mlp_init(jax.random.key(4), (6, 16, 3)))
    batches = [
        global_batch(mesh, make_batch(jax.random.key(500 + i), 2 * workers, 6, 3))
        for i in range(10)
    ]
    config = coarse.Config(shard_bytes=128)
    snaps = coarse.Snapshots(every=4, directory=directory)

    def make_step():
        @coarse.sync(mesh, config=config, snapshots=snaps)
        def step(params, batch):
            loss, params = coarse.value_and_update(mlp_loss, coarse.optim.adam(1e-2))(params, batch)
            return params, loss

        return step

    first = make_step()
    params = params0
    for b in batches:
        params, _ = first(params, b)
    first.wait_snapshots()
    _jax_compat.distributed_client().wait_at_barrier("snapshots written", 60_000)
    written = sorted(int(d) for d in os.listdir(directory) if d.isdigit())
    again = make_step()
    restored = again.restore(directory)
    assert again.restored_count == 8, (again.restored_count, written)
    for b in batches[again.restored_count :]:
        restored, _ = again(restored, b)
    assert digest(restored) == digest(params), "restored run ended elsewhere"
    result("snapshots", {"written": written, "digest": digest(params)})
    result("ok", "snapshots")


def scenario_nnx(mesh):
    from flax import nnx

    workers = P_LOCAL * jax.process_count()

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(5, 3, rngs=rngs)
            self.bn = nnx.BatchNorm(3, momentum=0.9, rngs=rngs)

        def __call__(self, x):
            return self.bn(self.lin(x))

    model = Net(nnx.Rngs(0))
    w = np.asarray(model.lin.kernel.get_value())
    b = np.asarray(model.lin.bias.get_value())
    batch = make_batch(jax.random.key(5), 2 * workers, 5, 3)

    def loss_fn(model, batch):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

    @coarse.sync(mesh)
    def step(model, batch):
        loss, grads = coarse.value_and_grad(loss_fn)(model, batch)
        return loss, grads

    loss, grads = step(model, global_batch(mesh, batch))
    # BatchNorm's running mean: 0.1 * the mean over workers of each worker's
    # batch mean, i.e. of the whole global batch (equal shards).
    h = np.asarray(batch["x"], np.float64) @ w + b
    close(model.bn.mean.get_value(), 0.1 * h.mean(0), 1e-5)
    result("nnx_digest", digest((loss, grads, nnx.state(model))))
    result("ok", "nnx")


def scenario_missing(mesh):
    params = jax.tree.map(np.asarray, mlp_init(jax.random.key(0), (4, 3)))
    batch = make_batch(jax.random.key(1), 4 * P_LOCAL * jax.process_count(), 4, 3)

    @coarse.sync(mesh, config=coarse.Config(timeout_s=5))
    def step(params, batch):
        return coarse.value_and_grad(mlp_loss)(params, batch)

    gbatch = global_batch(mesh, batch)
    if jax.process_index() == 1:
        time.sleep(120)  # never arrives; the launcher stops it
        os._exit(0)
    start = time.monotonic()
    try:
        jax.block_until_ready(step(params, gbatch))
    except RuntimeError as err:
        result("error", {"message": str(err), "seconds": time.monotonic() - start})
        os._exit(3)  # not through jax.distributed's shutdown barrier: process 1 never comes
    result("error", None)
    os._exit(0)


def scenario_dropped(mesh):
    from coarse_jax import _ffi, _jax_compat

    params = jax.tree.map(np.asarray, mlp_init(jax.random.key(0), (4, 3)))
    batch = make_batch(jax.random.key(1), 4 * P_LOCAL * jax.process_count(), 4, 3)

    @coarse.sync(mesh, config=coarse.Config(timeout_s=2))
    def step(params, batch):
        return coarse.value_and_grad(mlp_loss)(params, batch)

    gbatch = global_batch(mesh, batch)
    jax.block_until_ready(step(params, gbatch))  # compiled, healthy on every host
    dropped = 0 if jax.process_index() == 0 else P_LOCAL - 1
    _ffi.inject_dropped_push(dropped)
    try:
        jax.block_until_ready(step(params, gbatch))
    except Exception as err:  # jaxlib's JaxRuntimeError
        result("error", {"dropped": dropped, "message": str(err)[:4000]})
    else:
        result("error", {"dropped": dropped, "message": None})
    # Every process reports before any exits (the launcher stops the rest at
    # the first exit); not through jax.distributed's shutdown: the failed
    # step's collectives over "host" never completed.
    _jax_compat.distributed_client().wait_at_barrier("coarse_test/dropped", 60_000)
    os._exit(3)


def main():
    assert initialize(), "run me with python -m coarse_jax.launch"
    mesh = coarse.make_mesh(workers=P_LOCAL, proxies=Q_LOCAL, proxies_on=PROXIES_ON)
    # The workers, device or host proxies alike; the proxies recorded beside.
    assert mesh.axis_names == ("host", "tier", "data"), mesh
    assert mesh.devices.shape == (jax.process_count(), 1, P_LOCAL), mesh.devices.shape
    proxies = proxies_of(mesh)
    assert (proxies.on, proxies.count) == (PROXIES_ON, Q_LOCAL), proxies
    if PROXIES_ON == "devices":
        assert two_tier_mesh(mesh).devices.shape == (jax.process_count(), 2, P_LOCAL)
    scenarios = {
        "sync": scenario_sync,
        "optax": scenario_optax,
        "update": scenario_update,
        "snapshots": scenario_snapshots,
        "nnx": scenario_nnx,
        "missing": scenario_missing,
        "dropped": scenario_dropped,
    }
    scenarios[sys.argv[1]](mesh)
    jnp.zeros(()).block_until_ready()


if __name__ == "__main__":
    main()
