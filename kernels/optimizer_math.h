// The proxy optimizer's arithmetic on one element, shared by the CPU backend
// (ffi/cpu/cpu_backend.cc), the host stream (ffi/cpu/host_kernels.cc) and the
// CUDA kernel (kernels/optim.cu): pure arithmetic, so it lives with the
// kernels and the runtime includes it from here (arrows point down). One set of
// formulas for both (each compiler may still fuse a multiply-add, so the last
// bit can differ between platforms; on one platform results are bitwise
// reproducible). The formulas follow optax's
// transformations op for op (coarse_jax/optim.py names the equivalent chain):
//
//   clip_by_global_norm(c):  g = norm < c ? g : (g / norm) * c
//   sgd:   g += wd * w (add_decayed_weights, masked);
//          momentum: t = g + momentum * t;  u = nesterov ? g + momentum * t : t
//   adam:  m = (1 - b1) * g + b1 * m;  v = (1 - b2) * g^2 + b2 * v
//          u = (m / bc1) / (sqrt(v / bc2) + eps)
//   adamw: adam, then u += wd * w (masked)
//   all:   w = w + (-lr) * u
//
// Per-step scalars (lr from the schedule, the bias corrections bc1 = 1 - b1^t,
// bc2 = 1 - b2^t) are computed by XLA from the proxies' step count; the
// runtime copies them beside the proxy's state and the kernels read them
// there (OptScalars::step, WithStep), so no host ever reads them. The
// hyperparameters come from the plan's attributes.
#pragma once

#include <cstdint>

#include "element_math.h"  // COARSE_HD

#if defined(__CUDACC__)
#include <math.h>
#else
#include <cmath>
#endif

namespace coarse {

enum class OptKind : int32_t { kSgd = 0, kAdam = 1, kAdamW = 2 };

// Everything one update of a run of elements needs, by value (a kernel
// argument).
struct OptScalars {
  OptKind kind = OptKind::kSgd;
  int32_t nesterov = 0;
  int32_t decay = 0;               // weight decay applies to these elements (mask)
  int32_t clip = 0;                // global-norm clipping is active this step (norm >= clip_norm)
  float lr = 0, bc1 = 1, bc2 = 1;  // per step
  float b1 = 0, one_minus_b1 = 1, b2 = 0, one_minus_b2 = 1, eps = 0;
  float weight_decay = 0, momentum = 0;
  float norm = 1, clip_norm = 1;  // clip: g = (g / norm) * clip_norm
  // lr, bc1, bc2 in the memory of the device that runs the update (a GPU's
  // or the host's), read when the update runs (WithStep); null: the fields
  // above hold them.
  const float* step = nullptr;
  // norm and the clip flag (ClipScalarsOf), likewise: global-norm clipping
  // summed on the device, read there by the kernels; null: norm, clip hold them.
  const float* clip_at = nullptr;
};

// The global norm's clip scalars from its parts (each proxy's f64 sum of
// squares), added in proxy order from 0: out[0] = norm = float(sqrt(total)),
// out[1] = 1 where clipping applies (!(norm < clip_norm), so a NaN norm
// clips, as optax's clip_by_global_norm), else 0.
COARSE_HD void ClipScalarsOf(const double* parts, int64_t num, float clip_norm, float* out) {
  double total = 0;
  for (int64_t j = 0; j < num; ++j) total += parts[j];
#if defined(__CUDACC__)
  const float norm = static_cast<float>(sqrt(total));
#else
  const float norm = static_cast<float>(std::sqrt(total));
#endif
  out[0] = norm;
  out[1] = !(norm < clip_norm) ? 1.0f : 0.0f;
}

// `o` with this step's lr, bc1, bc2 read from `o.step`: each kernel calls it
// once, when it runs (stream order puts it after the copy that wrote them).
COARSE_HD OptScalars WithStep(OptScalars o) {
  if (o.step != nullptr) {
    o.lr = o.step[0];
    o.bc1 = o.step[1];
    o.bc2 = o.step[2];
    o.step = nullptr;
  }
  if (o.clip_at != nullptr) {
    o.norm = o.clip_at[0];
    o.clip = o.clip_at[1] != 0.0f;
    o.clip_at = nullptr;
  }
  return o;
}

// Optimizer state slots per element besides the master weight: sgd with
// momentum 1 (trace), sgd without 0, adam/adamw 2 (mu, nu).
COARSE_HD int32_t OptSlots(OptKind kind, float momentum) {
  return kind == OptKind::kSgd ? (momentum != 0.0f ? 1 : 0) : 2;
}

// The scalar lane: one float, the square root of the platform. A vector
// lane (cpu/adam_avx2.cc: eight floats) supplies its own Sqrt.
struct ScalarLane {
  static COARSE_HD float Sqrt(float x) {
#if defined(__CUDACC__)
    return sqrtf(x);
#else
    return std::sqrt(x);
#endif
  }
};

// Adam / AdamW on one lane of elements (a float, or a vector of them: the
// host's AVX2 loop runs this very function eight elements at a time, so the
// formulas exist once for every platform). Returns the new weight; the
// moments are written through s0, s1. The flags are the caller's, one per
// call, so a branch on them costs no lane anything.
template <typename T, typename Lane = ScalarLane>
COARSE_HD T AdamStep(const OptScalars& o, T g, T w, T* s0, T* s1) {
  if (o.clip) g = (g / o.norm) * o.clip_norm;
  const T m = o.one_minus_b1 * g + o.b1 * *s0;
  const T v = o.one_minus_b2 * (g * g) + o.b2 * *s1;
  *s0 = m;
  *s1 = v;
  T u = (m / o.bc1) / (Lane::Sqrt(v / o.bc2) + o.eps);
  if (o.kind == OptKind::kAdamW && o.decay) u = u + o.weight_decay * w;
  return w + (-o.lr) * u;
}

// One element: `g` the mean gradient, `w` the f32 master weight, `s0`, `s1`
// the state slots (read, then overwritten). Returns the new weight; the new
// state is written through s0/s1.
COARSE_HD float OptStep(const OptScalars& o, float g, float w, float* s0, float* s1) {
  if (o.kind != OptKind::kSgd) return AdamStep(o, g, w, s0, s1);
  if (o.clip) g = (g / o.norm) * o.clip_norm;
  if (o.decay) g = g + o.weight_decay * w;
  float u = g;
  if (o.momentum != 0.0f) {
    const float t = g + o.momentum * *s0;
    *s0 = t;
    u = o.nesterov ? g + o.momentum * t : t;
  }
  return w + (-o.lr) * u;
}

}  // namespace coarse
