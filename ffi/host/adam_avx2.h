// The host optimizer's AVX2 loop: Adam/AdamW eight elements at a time, the
// arithmetic of kernels/optimizer_math.h's AdamStep itself (instantiated on
// a vector of eight floats), so the formulas exist once for every platform.
// Its file alone is built for AVX2 (without FMA: no multiply-add is fused,
// so each operation rounds as the scalar one does, and the bits are the
// scalar loop's); element_loops.cc calls it only where the CPU has AVX2. The
// file includes nothing but the formulas: an inline function of a shared
// header built there could be the copy the linker keeps for every caller.
#pragma once

#include <cstdint>

#include "kernels/optimizer_math.h"

namespace coarse::cpu {

// From this many elements in one call the new weight and moments go out with
// streaming stores: they are read again a step later, long evicted by then,
// and a plain store first reads each line it writes (12 more bytes per
// element on top of the 32 the pass must move). One pass over 2^22 elements
// on this project's 2-core EPYC took 5.5 ms instead of 10.0 (0.95-0.99 of
// one thread's STREAM triad, was 0.56). Below it the arrays may still be in
// the caches, which streaming stores would bypass. The weight written into
// the gradient's place is stored plainly: the pulls read it next.
inline constexpr int64_t kStreamStoresFrom = int64_t{1} << 18;

// Adam/AdamW (o.kind) on the first n / 8 * 8 elements; returns how many it
// did. grad_io: the mean gradient in, the new weight out (as w_out); m, v:
// the moments in, m_out, v_out: out. `o` has its step's scalars (WithStep).
int64_t AdamAvx2(const OptScalars& o, float* grad_io, const float* w_in, float* w_out,
                 const float* m_in, const float* v_in, float* m_out, float* v_out, int64_t n);

}  // namespace coarse::cpu
