// HostOptimizerBench (see host_bench.h).
#include "lab/host_bench.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include "host/element_loops.h"
#include "host/host_pool.h"

namespace coarse {

HostOptimizerBench::HostOptimizerBench(int64_t n) : n_(n < 8 ? 8 : n) {
  for (float*& a : arrays_) {
    void* p = mmap(nullptr, static_cast<size_t>(n_) * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    a = static_cast<float*>(p);
  }
  for (int64_t i = 0; i < n_; ++i) {  // touches every page before a timed pass
    const float g = 1e-2f * std::sin(0.1f * static_cast<float>(i));
    arrays_[0][i] = g;
    arrays_[1][i] = arrays_[2][i] = std::cos(0.3f * static_cast<float>(i));
    arrays_[3][i] = arrays_[4][i] = 0.5f * g;
    arrays_[5][i] = arrays_[6][i] = 0.3f * g * g;
    arrays_[7][i] = 0.0f;
  }
}

HostOptimizerBench::~HostOptimizerBench() {
  for (float* a : arrays_)
    if (a != nullptr) munmap(a, static_cast<size_t>(n_) * sizeof(float));
}

namespace {

OptScalars BenchScalars(bool adamw) {
  OptScalars o;
  o.kind = adamw ? OptKind::kAdamW : OptKind::kAdam;
  o.decay = adamw ? 1 : 0;
  o.lr = 1e-3f;
  o.b1 = 0.9f;
  o.one_minus_b1 = 0.1f;
  o.b2 = 0.999f;
  o.one_minus_b2 = 1e-3f;
  o.bc1 = 0.1f;
  o.bc2 = 1e-3f;
  o.eps = 1e-8f;
  o.weight_decay = 1e-2f;
  return o;
}

}  // namespace

void HostOptimizerBench::Adam(bool adamw, bool vectorized, bool parallel) {
  const OptScalars o = BenchScalars(adamw);
  const int in = parity_, out = 1 - parity_;
  OptBuffers b{};
  b.grad_io = arrays_[0];
  b.w_in = arrays_[1 + in];
  b.w_out = arrays_[1 + out];
  b.s_in[0] = arrays_[3 + in];
  b.s_out[0] = arrays_[3 + out];
  b.s_in[1] = arrays_[5 + in];
  b.s_out[1] = arrays_[5 + out];
  if (parallel)  // as the host stream's optimizer runs it (host/host_kernels.cc)
    cpu::ParallelFor(n_, cpu::kParallelMinElems, [&](int64_t lo, int64_t hi) {
      cpu::OptimizerF32(o, cpu::AdvanceBuffers(b, lo), hi - lo, vectorized);
    });
  else
    cpu::OptimizerF32(o, b, n_, vectorized);
  parity_ = out;
}

int64_t HostOptimizerBench::FirstMismatchWithScalar(bool adamw, int64_t offset,
                                                    int64_t count) const {
  if (offset < 0 || count < 0 || offset + count > n_) throw std::out_of_range("offset + count > n");
  const int64_t len = offset + count;
  const size_t bytes = (static_cast<size_t>(len) * sizeof(float) + 63) / 64 * 64;
  // [set][grad, w in, w out, m in, m out, v in, v out]
  std::vector<std::unique_ptr<float, decltype(&std::free)>> mem;
  float* a[2][7];
  for (auto& set : a)
    for (float*& p : set) {
      p = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (p == nullptr) throw std::bad_alloc();
      mem.emplace_back(p, &std::free);
    }
  const float* inputs[7] = {arrays_[0],           arrays_[1 + parity_], arrays_[2 - parity_],
                            arrays_[3 + parity_], arrays_[4 - parity_], arrays_[5 + parity_],
                            arrays_[6 - parity_]};
  for (auto& set : a)
    for (int j = 0; j < 7; ++j) std::memcpy(set[j], inputs[j], static_cast<size_t>(len) * 4);
  const OptScalars o = BenchScalars(adamw);
  for (int set = 0; set < 2; ++set) {
    OptBuffers b{};
    b.grad_io = a[set][0];
    b.w_in = a[set][1];
    b.w_out = a[set][2];
    b.s_in[0] = a[set][3];
    b.s_out[0] = a[set][4];
    b.s_in[1] = a[set][5];
    b.s_out[1] = a[set][6];
    cpu::OptimizerF32(o, cpu::AdvanceBuffers(b, offset), count, /*vectorized=*/set == 0);
  }
  for (int64_t i = offset; i < len; ++i)
    for (int j : {0, 2, 4, 6})
      if (std::memcmp(a[0][j] + i, a[1][j] + i, sizeof(float)) != 0) return i;
  return -1;
}

void HostOptimizerBench::Triad() { cpu::TriadF32(arrays_[7], arrays_[1], arrays_[3], 0.5f, n_); }

}  // namespace coarse
