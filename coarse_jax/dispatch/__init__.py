"""The dispatcher: what happens between a `coarse.sync` step's call and its program.

`coarse_jax.api` holds the user's calls; this package holds the machinery a
step's call goes through, below them (it imports none of them):

* `arguments.py`: a call bound to the step's signature, as ``jax.jit`` binds
  it (positions, keywords, batch / static / donated), and its `CallBinding`;
* `placement.py`: arguments onto the workers, outputs back where the
  arguments were;
* `program.py`: the step's program, ``jit(shard_map(body))`` over the workers,
  and `compiles.py`, what XLA compiled and why it compiled again;
* `in_flight.py`: the calls dispatched and not yet finished, bounded;
* `context.py`: what a traced step knows while its function runs (mesh,
  config, call sites), read by the user's calls as they trace;
* `outputs.py`, `axis_names.py`, `uniform.py`, `params_check.py`: what a step
  may return, the axis names it may use, every device running every coarse
  call, and whether its params need the proxies' check;
* `arrival.py`: across hosts, every process dispatches each call;
* `nnx.py`: Flax NNX objects as arguments;
* `static_leaves.py`: arguments' and outputs' leaves that are not arrays, compiled in
  (an Equinox Module's functions and flags), as ``eqx.filter_jit`` does;
* `eqx_state.py`: an ``eqx.nn.State`` each worker's inside the step, the mean after.
"""
