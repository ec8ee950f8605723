"""Property-based fuzzing of the whole synchronization against a float64 numpy oracle.

Random trees (scalars to many-shard tensors, mixed float32/bfloat16/float16),
shard sizes down to 4 bytes, latency thresholds, crossing routes, the
leading split, op and p in {1, 2, 4}, through `coarse.all_reduce` and through
`coarse.value_and_grad` (a loss whose gradients are the batch itself). Every
result must equal the mean (or sum) of the workers' values within the
rounding the dtype allows, and be bitwise the same on every device.

`make test` runs a fixed, derandomized set (hypothesis profile "ci"); `make
fuzz` runs profile "fuzz" with a fresh seed per round for an hour
(tools/fuzz.sh), printing the seed of any failure: rerun it with
``pytest tests/test_fuzz.py --hypothesis-profile=fuzz --hypothesis-seed=SEED``.
"""

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import assert_replicated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coarse_jax as coarse

settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("COARSE_HYPOTHESIS_PROFILE", "ci"))

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
# Relative rounding of one result in each dtype (a half ulp, doubled for safety).
EPS = {"f32": 2.0**-23, "bf16": 2.0**-7, "f16": 2.0**-10}
_MESHES: dict[tuple[int, int], jax.sharding.Mesh] = {}


def _mesh(p, q):
    if (p, q) not in _MESHES:
        _MESHES[p, q] = coarse.make_mesh(workers=p, proxies=q)
    return _MESHES[p, q]


@st.composite
def cases(draw):
    p = draw(st.sampled_from([1, 2, 4, 6]))
    # q proxies, each shared by k = p / q workers (COARSE k:1); 6 = 4 workers + 2 proxies.
    q = draw(st.sampled_from([d for d in range(1, p + 1) if p % d == 0 and p + d <= 8]))
    shape = st.one_of(
        st.just(()),
        st.tuples(st.integers(1, 64)),
        st.tuples(st.integers(1, 24), st.integers(1, 24)),
        st.tuples(st.integers(1000, 20000)),  # many shards
    )
    leaves = draw(
        st.lists(st.tuples(shape, st.sampled_from(sorted(DTYPES))), min_size=1, max_size=24)
    )
    total = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(DTYPES[d]).itemsize for s, d in leaves)
    proxy = st.integers(0, q - 1)
    return {
        "p": p,
        "q": q,
        "leaves": leaves,
        "kind": draw(st.sampled_from(["all_reduce", "value_and_grad"])),
        "op": draw(st.sampled_from(["mean", "sum"])),
        "shard_bytes": draw(st.integers(4, 1 << 16)),
        "threshold": draw(st.integers(0, 1 << 17)),
        "routes": tuple(draw(st.tuples(proxy, proxy)) for _ in range(p)),
        "leading_bytes": draw(st.integers(0, total + 64)),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _run(case):
    p = case["p"]
    mesh = _mesh(p, case["q"])
    rng = np.random.default_rng(case["seed"])
    values = {
        f"t{i:02d}": (rng.standard_normal((p, *shape)) * 4).astype(DTYPES[d])
        for i, (shape, d) in enumerate(case["leaves"])
    }
    cfg = coarse.Config(
        shard_bytes=case["shard_bytes"],
        latency_threshold_bytes=case["threshold"],
        routes=case["routes"],
        leading_bytes=case["leading_bytes"],
        timeout_s=30.0,
    )
    if case["kind"] == "all_reduce":

        @coarse.sync(mesh, config=cfg)
        def step(per_worker):
            mine = jax.tree.map(lambda x: x[0], per_worker)
            return coarse.all_reduce(mine, op=case["op"])

        return values, step(values), case["op"]

    def loss(params, batch):  # d loss / d params[k] = this worker's batch[k]
        return sum(
            jnp.sum(params[k].astype(jnp.float32) * batch[k][0].astype(jnp.float32)) for k in params
        )

    params = {k: jnp.zeros(v.shape[1:], v.dtype) for k, v in values.items()}

    @coarse.sync(mesh, config=cfg)
    def vg_step(params, per_worker):
        return coarse.value_and_grad(loss)(params, per_worker)

    value, grads = vg_step(params, values)
    assert float(value) == 0.0
    return values, grads, "mean"


@pytest.mark.timeout(600)
@given(cases())
def test_sync_matches_float64_oracle_and_is_replicated(case):
    log = os.environ.get("COARSE_FUZZ_LOG")  # make fuzz counts the examples it ran
    if log:
        with open(log, "a") as fh:
            fh.write(f"{case['p']} {case['kind']} {len(case['leaves'])}\n")
    values, out, op = _run(case)
    p = case["p"]
    assert set(out) == set(values)
    for k, v in values.items():
        wide = v.astype(np.float64)
        want = wide.mean(axis=0) if op == "mean" else wide.sum(axis=0)
        got = np.asarray(out[k])
        assert got.dtype == v.dtype and got.shape == v.shape[1:], k
        name = next(n for n, d in DTYPES.items() if np.dtype(d) == v.dtype)
        # The result's own rounding, plus float32 accumulation of p terms.
        atol = EPS[name] * np.abs(want).max(initial=0) + 4 * p * 2.0**-24 * np.abs(wide).max()
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=atol, err_msg=k)
    assert_replicated(out)
