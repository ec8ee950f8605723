"""The host optimizer's AVX2 pass gives the scalar pass's bits (ffi/host/element_loops.cc).

A proxy's Adam/AdamW runs 8 elements at a time with AVX2 where the CPU has
it, with streaming stores for the new weight and moments from 2^18 elements
on, after a scalar prologue that aligns them; the scalar loop does the rest.
Every element takes the same operations in the same order either way, so a
proxy's state must not depend on the CPU, the size of its share or where the
share starts. Offsets misalign the copies as a proxy's owned chunks do;
sizes straddle the streaming threshold. On a CPU without AVX2 both passes
are the scalar one.
"""

from __future__ import annotations

import pytest

from coarse_jax._lab import lab_cpu

STREAMING_FROM = 1 << 18  # kStreamStoresFrom


@pytest.mark.parametrize("adamw", [False, True])
@pytest.mark.parametrize("offset", [0, 1, 3, 8, 13])
@pytest.mark.parametrize("count", [7, 1000, STREAMING_FROM - 1, STREAMING_FROM + 5])
def test_the_avx2_pass_gives_the_scalar_bits(adamw, offset, count):
    bench = lab_cpu().HostOptimizerBench(offset + count)
    bench.adam(adamw, True)  # a second state, moved on by one pass, as in training
    assert bench.first_mismatch_with_scalar(adamw, offset, count) == -1


def test_a_range_past_the_state_is_refused():
    bench = lab_cpu().HostOptimizerBench(64)
    with pytest.raises(IndexError):
        bench.first_mismatch_with_scalar(True, 60, 8)
