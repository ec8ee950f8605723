// coarse_pack / coarse_unpack / coarse_reduce: the device kernels as custom
// calls on one device (coarse_jax.kernels), registered for "cpu" and "CUDA"
// under the same names. Handler symbols: coarse::{Pack,Unpack,Reduce} (CPU,
// cpu/kernel_ops_cpu.cc) and coarse::cuda::{Pack,Unpack,Reduce}
// (cuda/kernel_ops_cuda.cc). This file: what both translate the same way.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace coarse {

// coarse_reduce takes at most this many arrays on every platform (the CUDA
// kernel passes them in its launch parameters; kernels::kMaxReduceInputs).
constexpr int kReduceMaxInputs = 8;

// coarse_reduce's operands: 1..kReduceMaxInputs arrays with the output's dtype and
// element count. The error names which operand is off and how.
xla::ffi::Error CheckReduceOperands(xla::ffi::RemainingArgs inputs, const xla::ffi::AnyBuffer& out);

}  // namespace coarse
