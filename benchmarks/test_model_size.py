"""The largest model that fits a fixed device budget (issue 38): BERT-shaped depth.

The budget is what `lax.pmean` + `optax.adamw` needs per worker for BERT-base
(12 layers, hidden 768, sequence 128, 8 sequences per worker, params and
optimizer state donated), on 4 workers. Against it, for each scheme, the
deepest BERT (hidden 768, the same batch) whose per-device memory fits:

* `lax.pmean` + `optax.adamw` on the 4 workers (params, gradients and the
  optimizer state on every worker);
* `coarse.value_and_update` + `coarse.optim.adamw` with the proxies in host
  memory (``proxies_on="host"``): the same 4 devices, the master parameters
  and the optimizer state in host memory; f32 params, and bf16 params on the
  workers (an f32 master on the proxies).

Memory is `coarse.diagnostics.memory_report` (XLA:CPU's buffer assignment of the compiled
program, plus the runtime's storage) and, for pmean, the compiled program's
memory analysis: nothing runs. The search compiles 12 and 24 layers, guesses
the boundary from their difference, then walks to it compiling each
candidate. Not in ``make bench`` (each BERT compile takes tens of seconds
here): run ``pytest -s benchmarks/test_model_size.py``.

``test_deepest_bert_that_fits_with_remat`` does the same with each encoder
layer rematerialized on both sides (the example's ``Bert(remat=True)``:
``nn.remat`` with ``jax.checkpoint_policies.nothing_saveable``), against the
budget `lax.pmean` + `optax.adamw` + that remat needs at BERT-base; a fair
comparison only because both sides remat identically. It needs XLA:CPU's
``cse_barrier_expander`` pass off, as the benchmarks' conftest sets (with it
on, XLA:CPU merges the recomputation back into the forward pass).
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import optax
import pytest
from baselines import pmean_optax_step

import coarse_jax as coarse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "bert"))
from train import Bert, make_loss

WORKERS = 4
SEQ = 128
BATCH = 8  # sequences per worker
BASE_LAYERS = 12


def _model(layers: int, remat: bool = False) -> Bert:
    return Bert(
        vocab_size=30522,
        seq_len=SEQ,
        num_layers=layers,
        d_model=768,
        num_heads=12,
        d_mlp=3072,
        remat=remat,
    )


def _batch() -> dict[str, jax.ShapeDtypeStruct]:
    n = BATCH * WORKERS
    return {
        "inputs": jax.ShapeDtypeStruct((n, SEQ), jnp.int32),
        "targets": jax.ShapeDtypeStruct((n, SEQ), jnp.int32),
        "weights": jax.ShapeDtypeStruct((n, SEQ), jnp.float32),
    }


def _params(layers: int, dtype) -> object:
    shapes = jax.eval_shape(_model(layers).init, jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), shapes)


def _n_params(layers: int) -> int:
    return sum(x.size for x in jax.tree.leaves(_params(layers, jnp.float32)))


def _pmean_bytes(layers: int, remat: bool = False) -> int:
    loss = make_loss(_model(layers, remat).apply)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    params = _params(layers, jnp.float32)
    state = jax.eval_shape(tx.init, params)
    step = jax.jit(pmean_optax_step(WORKERS, loss, tx), donate_argnums=(0, 1))
    m = step.lower(params, state, _batch()).compile().memory_analysis()
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )


def _coarse_host_bytes(dtype, remat: bool = False):
    mesh = coarse.make_mesh(workers=WORKERS, proxies_on="host")
    opt = coarse.optim.adamw(1e-4, weight_decay=0.01)

    def bytes_at(layers: int) -> int:
        loss = make_loss(_model(layers, remat).apply)

        @coarse.sync(mesh, donate_argnums=0)
        def step(params, batch):
            value, params = coarse.value_and_update(loss, opt)(params, batch)
            return params, value

        report = coarse.diagnostics.memory_report(step, _params(layers, dtype), _batch())
        return report.worker_bytes  # the proxies are in host memory

    return bytes_at


def _deepest(bytes_at, budget: int) -> tuple[int, int]:
    """(layers, bytes): the most layers whose bytes fit ``budget``."""
    seen: dict[int, int] = {}

    def at(layers: int) -> int:
        if layers not in seen:
            seen[layers] = bytes_at(layers)
        return seen[layers]

    lo, hi = at(BASE_LAYERS), at(2 * BASE_LAYERS)
    per_layer = (hi - lo) / BASE_LAYERS
    guess = BASE_LAYERS + int((budget - lo) // per_layer) if per_layer > 0 else BASE_LAYERS
    n = max(1, guess)
    while at(n) > budget and n > 1:
        n -= 1
    while at(n + 1) <= budget:
        n += 1
    return n, at(n)


def _row_lines(rows: list[tuple[str, int, int]], base_params: int) -> list[str]:
    """A line per (scheme, layers, bytes per worker) row: its params against BERT-base's."""
    lines = []
    for name, layers, used in rows:
        n = _n_params(layers)
        lines.append(
            f"  {name}: {layers} layers, {n / 1e6:.1f} M params "
            f"({n / base_params:.2f}x BERT-base), {used / 2**30:.2f} GiB per worker"
        )
    return lines


@pytest.mark.benchmark(group="model size")
def test_deepest_bert_that_fits(benchmark):
    budget = _pmean_bytes(BASE_LAYERS)
    rows = []

    def measure():
        rows.clear()
        rows.append(("lax.pmean + optax.adamw, f32", *_deepest(_pmean_bytes, budget)))
        for name, dtype in (("f32", jnp.float32), ("bf16 + f32 master", jnp.bfloat16)):
            got = _deepest(_coarse_host_bytes(dtype), budget)
            rows.append((f"coarse host proxies + coarse.optim.adamw, {name}", *got))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    base_params = _n_params(BASE_LAYERS)
    lines = [
        "",
        f"Budget: lax.pmean + optax.adamw, BERT-base ({base_params / 1e6:.1f} M params), "
        f"{BATCH} seqs/worker of {SEQ}, {WORKERS} workers: {budget / 2**30:.2f} GiB per worker",
    ]
    lines += _row_lines(rows, base_params)
    print("\n".join(lines))
    assert all(layers >= 1 for _, layers, _ in rows)


@pytest.mark.benchmark(group="model size")
def test_deepest_bert_that_fits_with_remat(benchmark):
    """Each encoder layer rematerialized on both sides: the deepest BERT that fits.

    Budget: `lax.pmean` + `optax.adamw` + remat at BERT-base. Then pmean and coarse
    (f32), both with remat, against the budget without remat (pmean + optax at
    BERT-base, as in ``test_deepest_bert_that_fits``).
    """
    plain_budget = _pmean_bytes(BASE_LAYERS)
    budget = _pmean_bytes(BASE_LAYERS, remat=True)
    assert budget < plain_budget, (
        "remat saved nothing: XLA:CPU's cse_barrier_expander pass is on. Fix: run with "
        "XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander (benchmarks/conftest.py)."
    )
    rows = []
    # Cached: the two budgets' searches share their compiles.
    pmean_remat = functools.cache(functools.partial(_pmean_bytes, remat=True))
    coarse_remat = functools.cache(_coarse_host_bytes(jnp.float32, remat=True))

    def measure():
        rows.clear()
        rows.append(("lax.pmean + optax.adamw + remat, f32", *_deepest(pmean_remat, budget)))
        got = _deepest(coarse_remat, budget)
        rows.append(("coarse host proxies + coarse.optim.adamw + remat, f32", *got))
        got = _deepest(_coarse_host_bytes(jnp.bfloat16, remat=True), budget)
        rows.append(("coarse host proxies + coarse.optim.adamw + remat, bf16 + f32 master", *got))
        # The same two, both with remat, in the budget without it.
        got = _deepest(pmean_remat, plain_budget)
        rows.append(("lax.pmean + optax.adamw + remat, f32, budget without remat", *got))
        got = _deepest(coarse_remat, plain_budget)
        rows.append(("coarse host proxies + remat, f32, budget without remat", *got))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    base_params = _n_params(BASE_LAYERS)
    lines = [
        "",
        "With remat on both sides: each encoder layer under "
        "nn.remat(policy=jax.checkpoint_policies.nothing_saveable), the same for pmean and "
        "coarse (a fair comparison only because both remat identically)",
        f"Budget: lax.pmean + optax.adamw + remat, BERT-base ({base_params / 1e6:.1f} M params), "
        f"{BATCH} seqs/worker of {SEQ}, {WORKERS} workers: {budget / 2**30:.2f} GiB per worker "
        f"(without remat: {plain_budget / 2**30:.2f} GiB, the last two rows' budget)",
    ]
    lines += _row_lines(rows, base_params)
    print("\n".join(lines))
    assert all(layers >= 1 for _, layers, _ in rows)
