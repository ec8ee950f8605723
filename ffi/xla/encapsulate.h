// Encapsulate: an XLA FFI handler symbol as the capsule
// jax.ffi.register_ffi_target takes, for both modules' registrations().
#pragma once

#include <nanobind/nanobind.h>

namespace coarse {

template <typename T>
nanobind::capsule Encapsulate(T* fn) {
  return nanobind::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace coarse
