"""Switches only tests turn, through `coarse_jax.testing`; product code reads them here.

They were environment variables (``COARSE_JAX_XLA_BELOW_BYTES``,
``COARSE_JAX_TEST_KILL_BEFORE_RENAME``, ``COARSE_JAX_XLA_HAND_OUT``). Product
code now reads only the variables the docs list for users (the getting
started guide's "Environment variables"); a test switch is a function call in
the process it changes, so it cannot leak into a user's run from a shell.
This module is at the bottom of the layers: it imports nothing of coarse_jax.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Hooks:
    """The process's test switches; `coarse_jax.testing` sets them, with their checks.

    Attributes:
      xla_below_bytes: the default of ``Config.xla_below_bytes`` ("auto", the
        user's, or bytes); the project's suite sets 0 so small trees go
        through the proxies, the path a GPU run takes.
      kill_before_rename: the optimizer step whose checkpoint, once written
        and before it is renamed complete, kills the process (SIGKILL); None:
        never.
      xla_hand_out: hand out within the host by XLA's all_gather on CPU
        workers too, as on GPUs (the multi-host tests run that path).
    """

    xla_below_bytes: int | str = "auto"
    kill_before_rename: int | None = None
    xla_hand_out: bool = False


HOOKS = Hooks()
