// The nanobind binding both modules use for sync_selftest(...)
// (lab/sync_selftest.h).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

#include "lab/sync_selftest.h"

namespace coarse {

using SelfTestValues =
    nanobind::ndarray<const float, nanobind::ndim<3>, nanobind::c_contig, nanobind::device::cpu>;
using SelfTestParams =
    nanobind::ndarray<const float, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

// values[steps, p, proxy_elems + leading_elems] -> the same shape.
inline nanobind::ndarray<nanobind::numpy, float, nanobind::ndim<3>> RunSyncSelfTest(
    SelfTestValues values, int64_t leading_elems, int64_t piece, const std::string& route,
    int64_t proxies, std::optional<SelfTestParams> params, float lr, float momentum, bool in_place,
    const SelfTestPlatform& platform) {
  SyncSelfTestSpec spec;
  spec.steps = static_cast<int64_t>(values.shape(0));
  spec.workers = static_cast<int64_t>(values.shape(1));
  const int64_t total = static_cast<int64_t>(values.shape(2));
  if (leading_elems < 0 || leading_elems > total)
    throw std::invalid_argument("sync_selftest: leading_elems must be in [0, values.shape[2]=" +
                                std::to_string(total) + "], got " + std::to_string(leading_elems));
  spec.proxies = proxies;
  spec.proxy_elems = total - leading_elems;
  spec.leading_elems = leading_elems;
  spec.piece = piece;
  spec.route = route;
  spec.in_place = in_place;
  spec.lr = lr;
  spec.momentum = momentum;
  if (lr > 0 && (!params.has_value() || static_cast<int64_t>(params->shape(0)) != spec.proxy_elems))
    throw std::invalid_argument(
        "sync_selftest: lr > 0 runs the proxy optimizer and needs params of shape "
        "[values.shape[2] - leading_elems] = [" +
        std::to_string(spec.proxy_elems) + "]");
  const float* initial = params.has_value() ? params->data() : nullptr;
  auto* out = new std::vector<float>();
  try {
    nanobind::gil_scoped_release release;
    *out = SyncSelfTest(spec, values.data(), initial, platform);
  } catch (...) {
    delete out;
    throw;
  }
  nanobind::capsule owner(out,
                          [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
  const size_t shape[3] = {static_cast<size_t>(spec.steps), static_cast<size_t>(spec.workers),
                           static_cast<size_t>(total)};
  return nanobind::ndarray<nanobind::numpy, float, nanobind::ndim<3>>(out->data(), 3, shape, owner);
}

// The arguments both modules take, in order.
#define COARSE_SELFTEST_ARGS                                                                \
  nanobind::arg("values"), nanobind::arg("leading_elems"), nanobind::arg("piece"),          \
      nanobind::arg("route"), nanobind::arg("proxies") = 0,                                 \
                              nanobind::arg("params") = nanobind::none(),                   \
                              nanobind::arg("lr") = 0.0f, nanobind::arg("momentum") = 0.0f, \
                              nanobind::arg("in_place") = false

#define COARSE_SELFTEST_DOC                                                                      \
  "Testing: the whole sync protocol without XLA. p threads run the workers' calls (push, "       \
  "proxy ring, worker ring, pull; mean) on values[steps, p, n] (worker w's gradient at each "    \
  "step), the service runs the proxies' jobs on its own devices; each step is a new session "    \
  "reusing the storage. The first n - leading_elems elements go through `proxies` proxies (0: "  \
  "p) in pieces of `piece` elements routed `route` (local, cross, dense), the rest through the " \
  "worker ring. lr > 0: the proxy optimizer (sgd with `momentum`) updates `params` instead, "    \
  "each step's result the next step's params. in_place: push_in_place. Returns [steps, p, n]: "  \
  "what each worker got. See ffi/lab/sync_selftest.h."

}  // namespace coarse
