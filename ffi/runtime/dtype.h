// The element types the runtime synchronizes, the same on every platform.
//
// Only floating leaves are synchronized: float32, bfloat16 and float16 (the
// Python side rejects the rest before lowering, and the XLA binding converts
// XLA's element types into these, refusing any other: xla/status_xla.h). Whatever a
// leaf's type, the runtime accumulates in f32 ("f32 accumulate for bf16/f16"):
// a push widens the leaf into f32 storage (proxies' arenas, workers' scratch),
// sums and the 1/p scale are f32, and a pull narrows once, rounding to nearest
// even, into the leaf's own type. A leaf's elements are addressed with its own
// byte width; the wire (Plan::piece_nbytes) counts the leaves' own bytes.
#pragma once

#include <cstdint>

#include "kernels/span.h"

namespace coarse {

// float32, bfloat16 or float16: the kernels' own enum, shared so that a
// leaf's type reaches a kernel unconverted. Whatever else XLA hands over is
// refused where XLA meets the runtime (xla/status_xla.h), before any phase.
using DType = kernels::DType;
using kernels::ByteWidth;

// "float32", "bfloat16" or "float16", for messages.
inline const char* DtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "an unsupported dtype";
}

// Element `offset` of a leaf of `dtype` that starts at `base`.
inline char* ElementPtr(void* base, DType dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * static_cast<int64_t>(ByteWidth(dtype));
}

}  // namespace coarse
