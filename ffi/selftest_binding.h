// The nanobind binding both modules use for sync_selftest(...).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "runtime/sync_selftest.h"

namespace coarse {

using SelfTestValues =
    nanobind::ndarray<const float, nanobind::ndim<2>, nanobind::c_contig, nanobind::device::cpu>;

// values[p, proxy_elems + leading_elems] -> [steps, 2p, proxy_elems + leading_elems].
inline nanobind::ndarray<nanobind::numpy, float, nanobind::ndim<3>> RunSyncSelfTest(
    SelfTestValues values, int64_t leading_elems, int64_t piece, const std::string& route,
    int64_t steps, const std::vector<int64_t>& ordinals, const MakeMember& make) {
  SyncSelfTestSpec spec;
  spec.workers = static_cast<int64_t>(values.shape(0));
  const int64_t total = static_cast<int64_t>(values.shape(1));
  if (leading_elems < 0 || leading_elems > total)
    throw std::invalid_argument("leading_elems must be in [0, values.shape[1]]");
  spec.proxy_elems = total - leading_elems;
  spec.leading_elems = leading_elems;
  spec.piece = piece;
  spec.route = route;
  spec.steps = steps;
  auto* out = new std::vector<float>();
  try {
    nanobind::gil_scoped_release release;
    *out = SyncSelfTest(spec, values.data(), ordinals, make);
  } catch (...) {
    delete out;
    throw;
  }
  nanobind::capsule owner(out,
                          [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
  const size_t shape[3] = {static_cast<size_t>(steps), static_cast<size_t>(2 * spec.workers),
                           static_cast<size_t>(total)};
  return nanobind::ndarray<nanobind::numpy, float, nanobind::ndim<3>>(out->data(), 3, shape, owner);
}

#define COARSE_SELFTEST_DOC                                                                   \
  "Testing: the whole sync protocol (push, proxy ring, worker ring, pull; mean) of "          \
  "values[p, n] on 2p threads, each its own device, for `steps` sessions: the first "         \
  "n - leading_elems elements go through the proxies in pieces of `piece` elements routed "   \
  "`route` (local, cross, dense), the rest through the worker ring. Returns [steps, 2p, n]: " \
  "workers' then proxies' results. See ffi/runtime/sync_selftest.h."

}  // namespace coarse
