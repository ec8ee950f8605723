"""8 virtual CPU devices, set before jax is imported anywhere.

`make test` is the CPU suite on every host, a GPU host too (its mesh tests
need 8 devices, which the CPU provides): jax is limited to the CPU unless
COARSE_TEST_GPU=1, which tools/gpu_check.sh sets to run the GPU cases (they
skip when jax sees no GPU).
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
if os.environ.get("COARSE_TEST_GPU") != "1":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
