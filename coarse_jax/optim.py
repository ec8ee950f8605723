"""`coarse.optim`: optimizers that run on the proxies (the parameter storage guide).

``coarse.optim.sgd / adam / adamw`` return a `ProxyOptimizer`, a frozen
dataclass of hyperparameters that `coarse.value_and_update` hands to the
runtime: each proxy keeps 1/p of the f32 master parameters and of the
optimizer state in its own memory and applies the update to the gradient
chunks it owns between the ring's reduce-scatter and all-gather
(ffi/runtime/optimizer_math.h has the arithmetic).

Semantics are optax's, op for op: `ProxyOptimizer.optax` builds the
equivalent optax transformation, and `ProxyOptimizer.optax_state` /
`ProxyOptimizer.from_optax_state` convert the proxies' state to and from its
state pytree, so a run can switch between coarse and plain optax.

* ``sgd(lr, momentum, nesterov, weight_decay)``:
  ``chain(add_decayed_weights(weight_decay), optax.sgd(lr, momentum or None, nesterov))``
  (the decay is added to the gradient before the momentum, as in PyTorch's SGD).
* ``adam(lr, b1, b2, eps)``: ``optax.adam(lr, b1, b2, eps)``.
* ``adamw(lr, b1, b2, eps, weight_decay, mask)``: ``optax.adamw(...)``.
* ``clip_norm=c``: ``optax.clip_by_global_norm(c)`` chained first.

``learning_rate`` is a float or an optax schedule (a function of the step
count). The schedule is evaluated by XLA on every device from the proxies'
step count (the optax count: updates applied so far), then passed to the
runtime with Adam's bias corrections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

Schedule = Callable[[Any], Any]
KINDS = {"sgd": 0, "adam": 1, "adamw": 2}


def _positive(name: str, value: float, where: str, allow_zero: bool = True) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(
            f"coarse.optim.{where}: {name} must be a finite number "
            f"{'>= 0' if allow_zero else '> 0'}, got {value!r}."
        )
    return v


@dataclasses.dataclass(frozen=True)
class ProxyOptimizer:
    """Hyperparameters of an optimizer the proxies run. Build with sgd / adam / adamw.

    A frozen dataclass that `coarse.value_and_update` hands to the runtime.
    Its semantics are optax's, op for op: `optax` builds the equivalent optax
    transformation, and `optax_state` / `from_optax_state` convert the
    proxies' state to and from that transformation's state.

    Attributes:
      kind: "sgd", "adam" or "adamw".
      learning_rate: a float or an optax schedule of the step count.
      b1: Adam's first-moment decay (unused by sgd).
      b2: Adam's second-moment decay (unused by sgd).
      eps: Adam's epsilon (unused by sgd).
      momentum: SGD's momentum (0: plain SGD, no state).
      nesterov: SGD's Nesterov momentum.
      weight_decay: decoupled (adamw) or added to the gradient (sgd); unused by adam.
      mask: which parameters weight decay applies to, as optax's ``mask``: a pytree of
        bools like the params, or a function of the params returning one; None: all.
      clip_norm: global-norm clipping of the mean gradient before the update; None: off.

    Example:
      >>> opt = coarse.optim.adam(1e-3)
      >>> opt.kind, opt.b1, opt.slots
      ('adam', 0.9, 2)
      >>> isinstance(opt, coarse.optim.ProxyOptimizer)
      True
    """

    kind: str
    learning_rate: float | Schedule
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    mask: Any = None
    clip_norm: float | None = None

    @property
    def slots(self) -> int:
        """Optimizer state values per parameter besides the master weight.

        0 for plain SGD, 1 for SGD with momentum (the trace), 2 for Adam and
        AdamW (mu and nu).

        Example:
          >>> coarse.optim.sgd(0.1).slots, coarse.optim.sgd(0.1, momentum=0.9).slots
          (0, 1)
        """
        if self.kind == "sgd":
            return 1 if self.momentum else 0
        return 2

    def optax(self) -> optax.GradientTransformation:
        """The equivalent optax transformation (what the proxies compute).

        Returns:
          An ``optax.GradientTransformation``, ``optax.sgd`` after
          ``add_decayed_weights``, ``optax.adam`` or ``optax.adamw``, after
          ``optax.clip_by_global_norm`` when ``clip_norm`` is set.

        Example:
          >>> tx = coarse.optim.adamw(1e-3, weight_decay=0.01).optax()
          >>> params = {"w": jnp.ones((2,))}
          >>> updates, state = tx.update({"w": jnp.ones((2,))}, tx.init(params), params)
          >>> updates["w"].shape
          (2,)
        """
        lr = self.learning_rate
        if self.kind == "sgd":
            core = optax.sgd(lr, momentum=self.momentum or None, nesterov=self.nesterov)
            if self.weight_decay:
                core = optax.chain(optax.add_decayed_weights(self.weight_decay, self.mask), core)
        elif self.kind == "adam":
            core = optax.adam(lr, b1=self.b1, b2=self.b2, eps=self.eps)
        else:
            core = optax.adamw(
                lr,
                b1=self.b1,
                b2=self.b2,
                eps=self.eps,
                weight_decay=self.weight_decay,
                mask=self.mask,
            )
        if self.clip_norm is not None:
            return optax.chain(optax.clip_by_global_norm(self.clip_norm), core)
        return core

    def scalars(self, count: jax.Array) -> jax.Array:
        """f32[3] (learning rate, 1 - b1^t, 1 - b2^t) of the update after ``count`` updates.

        Computed as optax computes them (its ``scale_by_schedule`` reads the
        schedule at the count before the update; ``scale_by_adam`` corrects
        with the count after it).

        Args:
          count: updates applied so far (an int32 scalar, traced or not).

        Returns:
          A float32 array of shape (3,).

        Example:
          >>> coarse.optim.adam(0.5, b1=0.5, b2=0.5).scalars(jnp.int32(0)).tolist()
          [0.5, 0.5, 0.5]
        """
        lr = self.learning_rate
        rate = lr(count) if callable(lr) else lr
        t = optax.safe_increment(count)
        bc1 = 1 - self.b1**t
        bc2 = 1 - self.b2**t
        return jnp.stack([jnp.asarray(rate, jnp.float32), bc1, bc2]).astype(jnp.float32)

    def decay_mask(self, params: Any) -> list[bool]:
        """Per leaf of ``params`` (flatten order): whether weight decay applies.

        Args:
          params: the params' pytree (only its structure and leaves are read).

        Returns:
          One bool per leaf; all False when the optimizer has no weight decay
          (or is adam).

        Raises:
          ValueError: ``mask`` does not have the structure of ``params``.

        Example:
          >>> opt = coarse.optim.adamw(1e-3, mask=lambda p: {"b": False, "w": True})
          >>> opt.decay_mask({"b": jnp.zeros(2), "w": jnp.zeros(2)})
          [False, True]
        """
        n = len(jax.tree.leaves(params))
        if not self.weight_decay or self.kind == "adam":
            return [False] * n
        if self.mask is None:
            return [True] * n
        mask = self.mask(params) if callable(self.mask) else self.mask
        leaves = jax.tree.leaves(mask)
        mask_def: Any = jax.tree.structure(mask)
        same = mask_def == jax.tree.structure(params)
        if not same or len(leaves) != n:
            raise ValueError(
                f"coarse.optim.{self.kind}: mask must be a pytree of bools with the params' "
                f"structure (or a function returning one), got {jax.tree.structure(mask)} for "
                f"params {jax.tree.structure(params)}."
            )
        return [bool(m) for m in leaves]

    def ffi_attrs(self) -> dict[str, Any]:
        """The hyperparameters as the runtime reads them (ffi/xla/optimizer_attrs.h).

        Returns:
          A dict from attribute name to a numpy scalar.

        Example:
          >>> int(coarse.optim.adamw(1e-3).ffi_attrs()["opt_kind"])
          2
        """
        return {
            "opt_kind": np.int64(KINDS[self.kind]),
            "opt_b1": np.float64(self.b1),
            "opt_b2": np.float64(self.b2),
            "opt_eps": np.float64(self.eps),
            # As optax computes them: in Python floats, then rounded once.
            "opt_one_minus_b1": np.float64(1 - self.b1),
            "opt_one_minus_b2": np.float64(1 - self.b2),
            "opt_weight_decay": np.float64(self.weight_decay if self.kind != "adam" else 0.0),
            "opt_momentum": np.float64(self.momentum if self.kind == "sgd" else 0.0),
            "opt_clip_norm": np.float64(self.clip_norm or 0.0),
            "opt_nesterov": np.int64(bool(self.nesterov)),
        }

    # -- state interop ----------------------------------------------------

    def optax_state(self, params: Any, count: int, slots: Sequence[Any]) -> Any:
        """The optax state of `optax` holding ``slots`` (trees like ``params``) after ``count``.

        Args:
          params: the params' pytree (the state's structure follows it).
          count: updates applied so far.
          slots: the trace (sgd with momentum) or (mu, nu) (adam, adamw),
            each a tree like ``params``.

        Returns:
          The state pytree of ``self.optax()``.

        Example:
          >>> opt = coarse.optim.adam(1e-3)
          >>> params = {"w": jnp.zeros((2,))}
          >>> state = opt.optax_state(params, 3, [{"w": jnp.ones((2,))}, {"w": jnp.ones((2,))}])
          >>> int(state[0].count), state[0].mu["w"].tolist()
          (3, [1.0, 1.0])
        """
        count_arr = jnp.asarray(count, jnp.int32)

        def fill(node: Any) -> Any:
            if isinstance(node, optax.TraceState):
                return node._replace(trace=slots[0])
            if isinstance(node, optax.ScaleByAdamState):
                return node._replace(count=count_arr, mu=slots[0], nu=slots[1])
            if isinstance(node, optax.ScaleByScheduleState):
                return node._replace(count=count_arr)
            if isinstance(node, tuple) and not hasattr(node, "_fields"):
                return tuple(fill(x) for x in node)
            if isinstance(node, optax.MaskedState):
                return node._replace(inner_state=fill(node.inner_state))
            return node

        return fill(self.optax().init(params))

    def from_optax_state(self, opt_state: Any) -> tuple[int, list[Any]]:
        """(count, slots) from a state of `optax` (the inverse of `optax_state`).

        Args:
          opt_state: a state of ``self.optax()``, from optax training or from
            `optax_state`.

        Returns:
          ``(count, slots)``, the updates applied so far and the trace or
          (mu, nu) trees.

        Raises:
          ValueError: ``opt_state`` lacks the state this optimizer needs (a
            momentum trace, Adam's moments, or a schedule's count).

        Example:
          >>> opt = coarse.optim.adam(1e-3)
          >>> count, (mu, nu) = opt.from_optax_state(opt.optax().init({"w": jnp.zeros(2)}))
          >>> count, mu["w"].tolist()
          (0, [0.0, 0.0])
        """
        found: dict[str, Any] = {}

        def walk(node: Any) -> None:
            if isinstance(node, optax.TraceState):
                found["trace"] = node.trace
            elif isinstance(node, optax.ScaleByAdamState):
                found["adam"] = node
            elif isinstance(node, optax.ScaleByScheduleState):
                found.setdefault("count", node.count)
            elif isinstance(node, optax.MaskedState):
                walk(node.inner_state)
            elif isinstance(node, tuple):
                for x in node:
                    walk(x)

        walk(opt_state)
        if self.kind == "sgd":
            if self.slots and "trace" not in found:
                raise ValueError(
                    "load_optimizer_state: opt_state has no optax TraceState (momentum); expected "
                    "the state of coarse.optim.sgd(...).optax()."
                )
            if "count" not in found and callable(self.learning_rate):
                raise ValueError(
                    "load_optimizer_state: opt_state has no ScaleByScheduleState (the schedule's "
                    "count); expected the state of this optimizer's .optax()."
                )
            count = int(found.get("count", 0))
            return count, [found["trace"]] if self.slots else []
        if "adam" not in found:
            raise ValueError(
                f"load_optimizer_state: opt_state has no optax ScaleByAdamState; expected the "
                f"state of coarse.optim.{self.kind}(...).optax()."
            )
        adam = found["adam"]
        return int(adam.count), [adam.mu, adam.nu]


def sgd(
    learning_rate: float | Schedule,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    *,
    mask: Any = None,
    clip_norm: float | None = None,
) -> ProxyOptimizer:
    """SGD on the proxies; optax's ``sgd`` after ``add_decayed_weights(weight_decay, mask)``.

    The decay is added to the gradient before the momentum, as in PyTorch's
    SGD; ``mask`` says which parameters decay, as `adamw`'s does.

    Args:
      learning_rate: a float, or an optax schedule of the step count (XLA
        evaluates it from the proxies' count).
      momentum: 0 for plain SGD (no state), else the momentum of the trace.
      nesterov: Nesterov momentum.
      weight_decay: L2 decay added to the gradient (0: none).
      mask: which parameters decay, as optax's ``mask``: a pytree of bools
        like the params, or a function of the params returning one; None: all.
      clip_norm: clip the mean gradient to this global norm first
        (``optax.clip_by_global_norm``); None: no clipping.

    Returns:
      A `ProxyOptimizer` for `coarse.value_and_update`.

    Raises:
      ValueError: a hyperparameter is negative or not finite, or
        ``clip_norm`` is not positive.

    Example:
      >>> opt = coarse.optim.sgd(0.1, momentum=0.9)
      >>> opt.slots, opt.optax() is not None
      (1, True)
      >>> no_bias = coarse.optim.sgd(0.1, weight_decay=1e-4, mask={"b": False, "w": True})
      >>> no_bias.decay_mask({"b": jnp.zeros(2), "w": jnp.zeros(2)})
      [False, True]
    """
    return _build(
        "sgd",
        learning_rate,
        momentum=_positive("momentum", momentum, "sgd"),
        nesterov=bool(nesterov),
        weight_decay=_positive("weight_decay", weight_decay, "sgd"),
        mask=mask,
        clip_norm=clip_norm,
    )


def adam(
    learning_rate: float | Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    clip_norm: float | None = None,
) -> ProxyOptimizer:
    """Adam on the proxies; optax's ``adam``.

    Args:
      learning_rate: a float, or an optax schedule of the step count.
      b1: the first moment's decay, in [0, 1).
      b2: the second moment's decay, in [0, 1).
      eps: added to the second moment's root.
      clip_norm: clip the mean gradient to this global norm first; None: no
        clipping.

    Returns:
      A `ProxyOptimizer` for `coarse.value_and_update`.

    Raises:
      ValueError: ``b1`` or ``b2`` outside [0, 1), or a negative or infinite
        hyperparameter, or ``clip_norm`` not positive.

    Example:
      >>> opt = coarse.optim.adam(1e-3, clip_norm=1.0)
      >>> opt.clip_norm, opt.slots
      (1.0, 2)
    """
    return _build("adam", learning_rate, b1=b1, b2=b2, eps=eps, clip_norm=clip_norm)


def adamw(
    learning_rate: float | Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    mask: Any = None,
    *,
    clip_norm: float | None = None,
) -> ProxyOptimizer:
    """AdamW on the proxies; optax's ``adamw`` (decay masked by ``mask``, as optax's).

    Args:
      learning_rate: a float, or an optax schedule of the step count.
      b1: the first moment's decay, in [0, 1).
      b2: the second moment's decay, in [0, 1).
      eps: added to the second moment's root.
      weight_decay: decoupled weight decay.
      mask: which parameters decay, as optax's ``mask``: a pytree of bools
        like the params, or a function of the params returning one; None: all.
      clip_norm: clip the mean gradient to this global norm first; None: no
        clipping.

    Returns:
      A `ProxyOptimizer` for `coarse.value_and_update`.

    Raises:
      ValueError: ``b1`` or ``b2`` outside [0, 1), or a negative or infinite
        hyperparameter, or ``clip_norm`` not positive.

    Example:
      >>> opt = coarse.optim.adamw(optax.cosine_decay_schedule(1e-3, 1000), weight_decay=0.01)
      >>> opt.kind, opt.weight_decay
      ('adamw', 0.01)
    """
    return _build(
        "adamw",
        learning_rate,
        b1=b1,
        b2=b2,
        eps=eps,
        weight_decay=_positive("weight_decay", weight_decay, "adamw"),
        mask=mask,
        clip_norm=clip_norm,
    )


def _build(kind: str, learning_rate: float | Schedule, **kw: Any) -> ProxyOptimizer:
    if not callable(learning_rate):
        _positive("learning_rate", learning_rate, kind)
        learning_rate = float(learning_rate)
    if kind != "sgd":
        for name in ("b1", "b2"):
            v = float(kw[name])
            if not 0 <= v < 1:
                raise ValueError(f"coarse.optim.{kind}: {name} must be in [0, 1), got {v!r}.")
        _positive("eps", kw["eps"], kind)
    if kw.get("clip_norm") is not None:
        kw["clip_norm"] = _positive("clip_norm", kw["clip_norm"], kind, allow_zero=False)
    return ProxyOptimizer(kind=kind, learning_rate=learning_rate, **kw)


__all__ = ["ProxyOptimizer", "adam", "adamw", "sgd"]
