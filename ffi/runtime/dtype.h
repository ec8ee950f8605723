// The element types the runtime synchronizes, the same on every platform.
//
// Only floating leaves are synchronized: float32, bfloat16 and float16 (the
// Python side rejects the rest before lowering; this is the runtime's own
// check, shared by the handlers and both backends' kernel ops). Whatever a
// leaf's type, the runtime accumulates in f32 ("f32 accumulate for bf16/f16"):
// a push widens the leaf into f32 storage (proxies' arenas, workers' scratch),
// sums and the 1/p scale are f32, and a pull narrows once, rounding to nearest
// even, into the leaf's own type. A leaf's elements are addressed with its own
// byte width; the wire (Plan::piece_nbytes) counts the leaves' own bytes.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace coarse {

// float32, bfloat16 or float16.
inline bool IsSupported(xla::ffi::DataType dtype) {
  return dtype == xla::ffi::DataType::F32 || dtype == xla::ffi::DataType::BF16 ||
         dtype == xla::ffi::DataType::F16;
}

// "float32", "bfloat16", "float16", or "an unsupported dtype", for messages.
inline const char* DtypeName(xla::ffi::DataType dtype) {
  switch (dtype) {
    case xla::ffi::DataType::F32: return "float32";
    case xla::ffi::DataType::BF16: return "bfloat16";
    case xla::ffi::DataType::F16: return "float16";
    default: return "an unsupported dtype";
  }
}

// Element `offset` of a leaf of `dtype` that starts at `base`.
inline char* ElementPtr(void* base, xla::ffi::DataType dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * xla::ffi::ByteWidth(dtype);
}

}  // namespace coarse
