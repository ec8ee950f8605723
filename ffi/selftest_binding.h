// The nanobind binding both modules use for ring_selftest(values, steps).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "ring_selftest.h"

namespace coarse {

inline nanobind::ndarray<nanobind::numpy, float, nanobind::ndim<3>> RunRingSelfTest(
    nanobind::ndarray<const float, nanobind::ndim<2>, nanobind::c_contig, nanobind::device::cpu>
        values,
    int64_t steps, const std::vector<int64_t>& ordinals, const MakeMember& make) {
  const int64_t p = static_cast<int64_t>(values.shape(0)), n = static_cast<int64_t>(values.shape(1));
  auto* out = new std::vector<float>();
  {
    nanobind::gil_scoped_release release;
    try {
      *out = RingSelfTest(p, n, values.data(), steps, ordinals, make);
    } catch (...) {
      delete out;
      throw;
    }
  }
  nanobind::capsule owner(out, [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
  return nanobind::ndarray<nanobind::numpy, float, nanobind::ndim<3>>(
      out->data(), {static_cast<size_t>(steps), static_cast<size_t>(p), static_cast<size_t>(n)},
      owner);
}

}  // namespace coarse
