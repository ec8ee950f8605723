"""Many different steps in one process, one after another and interleaved.

A user's notebook or a hyperparameter sweep decorates step after step in one
process: meshes of other ratios, device and host proxies, other plans, steps
dispatched without blocking, donated params, a companion step between two
updates. Whatever the runtime keeps across sessions (storage sets and their
staging rings, kept devices, span tables, ready flags, counters, the proxies'
stores) must fit the next session or be refused, never give a wrong value.

Each sequence is drawn from a seed. Every step is compared with its oracle,
which shares no code with coarse_jax, in lockstep (each step from the same
params): `coarse.value_and_update` with `lax.pmean` + optax, one step of the
oracle from coarse's previous params and the oracle's own optimizer state;
`coarse.value_and_grad` and `coarse.all_reduce` with float64 numpy. The
tolerance is rounding level: the coarse sums add in another order than
XLA's psum. Allowed: rtol 2e-5 and atol 2e-6 of the leaf's largest value
(params after an update: atol 1e-5, below). Measured on this 2-core VM: the
largest error is 2.1% of what is allowed over sequences 0-9 on the default
backend (`python tests/test_steps_in_sequence.py 0 1 ...` prints it); a
lost, stale or misplaced push is off by the gradient itself (the reduced
case of issue 62: 100% of the elements, up to 10x).

`make test` runs it on the default CPU backend, `make test-streams` on the
stream-semantics backend under its chaos seed; ``COARSE_SEQUENCE_SEEDS``
(``"0-39"`` or ``"3,7"``) picks other sequences.
"""

from __future__ import annotations

import dataclasses
import os
import random
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import make_batch, mlp_init, mlp_loss, pmean_optax_step

import coarse_jax as coarse
import coarse_jax.testing
from coarse_jax import _ffi

RTOL, ATOL_SCALE = 2e-5, 2e-6
# Params after an update: Adam's first steps move each weight by about lr * g / |g|, so a
# gradient's rounding (another reduction order) moves it by lr * dg / |g|, large where g
# is tiny: seen up to 6.0e-7 at lr 1e-2 (sequence 29, streams backend, chaos 11); a lost
# or stale push moves it by lr or more.
PARAMS_ATOL = 1e-5
WORST = [0.0]  # the largest |actual - expected| / allowed so far (python this_file.py prints it)

# (p, q, proxies_on): every ratio the 8 CPU devices hold.
LAYOUTS = [
    (1, 1, "devices"), (2, 2, "devices"), (4, 4, "devices"), (2, 1, "devices"),
    (3, 1, "devices"), (4, 2, "devices"), (5, 1, "devices"), (6, 2, "devices"),
    (7, 1, "devices"), (3, 3, "devices"),
    (1, 1, "host"), (2, 2, "host"), (4, 2, "host"), (6, 1, "host"), (8, 4, "host"),
    (8, 1, "host"), (3, 3, "host"),
]  # fmt: skip
OPTIMIZERS = ("sgd", "adam", "adamw")


def _seeds() -> list[int]:
    text = os.environ.get("COARSE_SEQUENCE_SEEDS", "0-5")
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


@dataclasses.dataclass
class Case:
    """One decorated step and how the sequence calls it."""

    kind: str  # "update", "grad", "all_reduce"
    p: int
    q: int
    on: str
    sizes: tuple[int, ...]
    shard_bytes: int
    crossing: bool
    donate: bool
    block_every: int
    steps: int
    optimizer: str
    companion: bool  # an all_reduce step of the same mesh between two calls
    in_flight: int | None


def draw_case(rng: random.Random) -> Case:
    p, q, on = rng.choice(LAYOUTS)
    kind = rng.choices(["update", "grad", "all_reduce"], weights=[5, 2, 1])[0]
    d_in = rng.randint(3, 16)
    sizes = (d_in, *(rng.randint(2, 48) for _ in range(rng.randint(1, 2))), rng.randint(1, 5))
    return Case(
        kind=kind,
        p=p,
        q=q,
        on=on,
        sizes=sizes,
        shard_bytes=rng.choice([16, 64, 100, 256, 1024, 1 << 14]),
        crossing=q > 1 and rng.random() < 0.5,
        donate=kind == "update" and rng.random() < 0.5,
        block_every=rng.choice([1, 2, 5]),
        steps=rng.randint(2, 4),
        optimizer=rng.choice(OPTIMIZERS),
        companion=rng.random() < 0.4,
        in_flight=rng.choice([None, 1, 2]),
    )


def _optimizers(name: str):
    """The proxies' optimizer and its optax twin (the oracle)."""
    sched = optax.exponential_decay(0.05, 1, 0.9)
    if name == "sgd":
        return (
            coarse.optim.sgd(sched, momentum=0.5, weight_decay=0.025),
            optax.chain(optax.add_decayed_weights(0.025), optax.sgd(sched, momentum=0.5)),
        )
    if name == "adam":
        return coarse.optim.adam(1e-2), optax.adam(1e-2)
    return coarse.optim.adamw(1e-2, weight_decay=0.1), optax.adamw(1e-2, weight_decay=0.1)


def _config(case: Case) -> coarse.Config:
    k = case.p // case.q
    routes = None
    if case.crossing:
        routes = tuple(((i // k + 1) % case.q, (i // k + 2) % case.q) for i in range(case.p))
    return coarse.Config(
        shard_bytes=case.shard_bytes,
        latency_threshold_bytes=128,
        xla_below_bytes=0,  # every tree through the runtime, however small
        routes=routes,
        max_steps_in_flight=case.in_flight,
        timeout_s=30.0,
    )


def _close(actual, expected, what: str, atol: float = 0.0) -> None:
    for path, a in jax.tree_util.tree_flatten_with_path(actual)[0]:
        e = expected
        for k in path:
            e = e[k.key] if hasattr(k, "key") else e[k.idx]
        e = np.asarray(e, np.float64)
        atol = max(atol, ATOL_SCALE * float(np.max(np.abs(e), initial=0.0)))
        err = np.abs(np.asarray(a, np.float64) - e)
        WORST[0] = max(WORST[0], float(np.max(err / (atol + RTOL * np.abs(e)), initial=0.0)))
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            e,
            rtol=RTOL,
            atol=atol,
            err_msg=f"{what} {jax.tree_util.keystr(path)}",
        )


class Runner:
    """Decorates a case's steps and checks every call of them against the oracle."""

    def __init__(self, case: Case, index: int):
        self.case, self.index = case, index
        c = case
        # Made right before its steps are decorated: jax keeps one Mesh per
        # devices, so the proxies of the last make_mesh of these workers win.
        self.mesh = coarse.make_mesh(workers=c.p, proxies=c.q, proxies_on=c.on)
        self.what = f"case {index} ({c.kind} {c.p}:{c.q} on {c.on}, sizes {c.sizes}, {c})"
        cfg = _config(c)
        self.params = mlp_init(jax.random.key(index), c.sizes)
        self.batches = [
            jax.tree.map(np.asarray, make_batch(jax.random.key(1000 * index + i), 2 * c.p,
                                                c.sizes[0], c.sizes[-1]))
            for i in range(c.steps)
        ]  # fmt: skip
        self.calls = 0
        self.pending: list = []  # (step, output) not yet checked
        if c.kind == "update":
            opt, self.tx = _optimizers(c.optimizer)
            self.oracle = pmean_optax_step(c.p, self.tx)
            self.state = self.tx.init(self.params)

            @coarse.sync(self.mesh, config=cfg, donate_argnums=0 if c.donate else None)
            def step(params, batch):
                loss, params = coarse.value_and_update(mlp_loss, opt)(params, batch)
                return params, loss

        elif c.kind == "grad":

            @coarse.sync(self.mesh, config=cfg)
            def step(params, batch):
                return coarse.value_and_grad(mlp_loss)(params, batch)

        else:

            @coarse.sync(self.mesh, config=cfg)
            def step(params, batch):
                del params
                return coarse.all_reduce(batch)

        self.step = step
        if c.companion:

            @coarse.sync(self.mesh, config=cfg)
            def companion(x):
                return coarse.all_reduce(x, op="sum")

            self.companion = companion
        self.current = jax.tree.map(jnp.copy, self.params)  # donated, maybe
        self.given = self.params  # the params of the next call, for the oracle

    def done(self) -> bool:
        return self.calls >= self.case.steps

    def call(self) -> None:
        """Dispatches the next step (without blocking, unless its turn to block)."""
        c, i = self.case, self.calls
        batch = self.batches[i]
        given = self.given
        out = self.step(self.current, batch)
        if c.kind == "update":
            self.current = out[0]
            # Copied before the next call donates it (a dispatched copy: no block).
            self.given = jax.tree.map(jnp.copy, out[0])
            out = (self.given, out[1])
        extra = None
        if c.companion:
            x = np.arange(c.p * 3, dtype=np.float32).reshape(c.p, 3) + i
            extra = (x, self.companion(x))
        self.pending.append((i, given, batch, out, extra))
        self.calls += 1
        if self.calls % c.block_every == 0 or self.done():
            self.check()

    def check(self) -> None:
        c = self.case
        for i, given, batch, out, extra in self.pending:
            where = f"{self.what}, call {i}"
            if c.kind == "update":
                params, loss = out
                # Lockstep: the oracle's step from the params coarse was given.
                want, self.state, want_loss = self.oracle(given, self.state, batch)
                _close(jax.device_get(params), jax.device_get(want), where + " params", PARAMS_ATOL)
                np.testing.assert_allclose(float(loss), float(want_loss), rtol=RTOL, err_msg=where)
            elif c.kind == "grad":
                loss, grads = out
                want_loss, want_grads = _mean_value_and_grad(self.params, batch, c.p)
                _close(jax.device_get(grads), want_grads, where + " grads")
                np.testing.assert_allclose(float(loss), want_loss, rtol=RTOL, err_msg=where)
            else:
                want = jax.tree.map(
                    lambda x: np.asarray(x, np.float64).reshape(c.p, -1, *x.shape[1:]).mean(0),
                    batch,
                )
                _close(jax.device_get(out), want, where + " all_reduce")
            if extra is not None:
                x, got = extra
                want = np.asarray(x, np.float64).reshape(c.p, 1, 3).sum(0)
                _close(np.asarray(got), want, where + " companion")
        self.pending.clear()


def _mean_value_and_grad(params, batch, p: int):
    """Each worker's slice differentiated alone, averaged in float64 numpy."""
    n = batch["x"].shape[0] // p
    fn = jax.jit(jax.value_and_grad(mlp_loss))
    parts = [fn(params, jax.tree.map(lambda x, lo=w * n: x[lo : lo + n], batch)) for w in range(p)]
    loss = float(np.mean([np.float64(v) for v, _ in parts]))
    grads = jax.tree.map(
        lambda *g: np.mean([np.asarray(x, np.float64) for x in g], axis=0), *[g for _, g in parts]
    )
    return loss, grads


def run_sequence(seed: int, cases: int = 7) -> None:
    """Draws `cases` steps from `seed` and runs them interleaved, two or three at a time."""
    # A mesh of workers another live case uses with other proxies: each step
    # keeps the proxies it was decorated with (what the warning says).
    warnings.simplefilter("ignore", coarse.mesh.ProxiesReplaced)
    rng = random.Random(seed)
    todo = [draw_case(rng) for _ in range(cases)]
    live: list[Runner] = []
    index = 100 * seed
    while todo or live:
        while todo and len(live) < rng.randint(1, 3):
            live.append(Runner(todo.pop(0), index))
            index += 1
        runner = rng.choice(live)
        runner.call()
        if runner.done():
            live.remove(runner)


@pytest.mark.parametrize("seed", _seeds())
def test_steps_in_sequence_match_their_oracles(seed):
    run_sequence(seed)


def test_a_step_between_two_calls_of_another_on_shared_devices():
    """Issue 62, reduced from sequence 27: two calls of an 8-worker step with its proxy in
    host memory and 100-byte pieces, a 1-worker step dispatched between them, none blocked
    on. On the streams backend XLA:CPU ran the small step's program beside the big one's
    second call; its call drained worker 0's stream, which held the big call's pull behind
    its proxy's flag, and the thread it kept was the one worker 7's part needed: worker 7
    never pushed, the proxy timed out (every run), and the workers whose pulls saw the
    proxies leave returned the stale values its released flags let through, with no error
    (2 runs in 15)."""
    big = Case(kind="grad", p=8, q=1, on="host", sizes=(7, 6, 1), shard_bytes=100,
               crossing=False, donate=False, block_every=5, steps=2, optimizer="sgd",
               companion=False, in_flight=1)  # fmt: skip
    small = dataclasses.replace(big, p=1, on="devices", sizes=(16, 18, 10, 5), in_flight=2)
    first, second = Runner(big, 2700), Runner(small, 2702)
    first.call()
    second.call()
    first.call()
    first.check()
    second.check()


if __name__ == "__main__":
    import sys

    for s in [int(a) for a in sys.argv[1:]] or _seeds():
        run_sequence(s)
        print("sequence", s, "ok; worst error / allowed so far", WORST[0], flush=True)


@pytest.mark.skipif(
    coarse.testing.active_backend("cpu") != "streams",
    reason="ready flags exist on device streams only (COARSE_JAX_BACKEND=streams)",
)
def test_a_stale_counter_in_a_reused_storage_set_is_refused():
    """A deliberate bug in what outlives a session: the next session reuses its storage
    set's previous use count (`_ffi.inject_stale_flags`). Its pulls' flag waits would then
    pass over what the last session left; the proxy refuses the step naming the flag, and
    the next step, on a fresh count, matches its oracle again."""
    case = Case(kind="grad", p=4, q=2, on="host", sizes=(5, 9, 2), shard_bytes=64,
                crossing=False, donate=False, block_every=1, steps=3, optimizer="sgd",
                companion=False, in_flight=None)  # fmt: skip
    runner = Runner(case, 9000)
    runner.call()  # the set's flags now hold this session's value
    _ffi.inject_stale_flags()
    with pytest.raises(Exception, match=r"stale state .* ready flag of tensor"):
        runner.call()
    runner.pending.clear()
    runner.call()  # checked against float64 numpy: the state left is right


def test_the_sequence_issue_62_reported():
    """Issue 62's report: 4 steps each of 7:1, 5:1 and 3:1 device meshes (value_and_update
    with tiny pieces, a companion all_reduce, dispatched without blocking, the last not
    blocked on), then 8 steps of sgd with momentum, decay and a schedule on 6 workers with
    one proxy in host memory: 100-byte pieces, params donated, `max_steps_in_flight=2`,
    every 5th step blocked on, batches as numpy arrays, each against optax in lockstep."""
    for p in (7, 5, 3):
        pre = Case(kind="update", p=p, q=1, on="devices", sizes=(10, 30, 5), shard_bytes=100,
                   crossing=False, donate=True, block_every=3, steps=4, optimizer="adam",
                   companion=True, in_flight=2)  # fmt: skip
        pending = Runner(pre, 6200 + p)
        for _ in range(4 if p > 3 else 3):
            pending.call()  # the 3:1 step's 4th call comes below, between the target's
    target = Case(kind="update", p=6, q=1, on="host", sizes=(14, 45, 3), shard_bytes=100,
                  crossing=False, donate=True, block_every=5, steps=8, optimizer="sgd",
                  companion=False, in_flight=2)  # fmt: skip
    runner = Runner(target, 6206)
    runner.call()
    pending.call()  # a 3:1 call between the target's first two, not blocked on
    while not runner.done():
        runner.call()
