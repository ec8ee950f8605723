// pack / unpack: one launch moves every span between leaves and a packed buffer.
//
// The packed buffer's element space (the concatenation of the spans, in
// order) is cut into tiles of kTile elements, one block each. A block finds
// the span holding its first element by binary search over Span::begin, then
// walks spans until its tile ends. Within a span the block's threads move 4
// elements at a time (16-byte f32 / 8-byte bf16,f16 accesses, coalesced),
// with several loads in flight per thread before the first store; misaligned
// heads and tails go element by element. So 2,000 tiny leaves and one 64 MiB
// leaf are both a single launch with no per-leaf host work.
#include "coarse_kernels.h"
#include "elementwise.cuh"

namespace coarse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTile = 16384;  // elements per block: 16 vectors per thread
constexpr int kUnroll = 4;        // vector loads in flight per thread

template <typename S, typename D>
__device__ __forceinline__ Vec4<D> Convert(const Vec4<S>& x, float scale) {
  Vec4<D> y;
#pragma unroll
  for (int e = 0; e < kVec; ++e) y.v[e] = FromF32<D>(ToF32(x.v[e]) * scale);
  return y;
}

// The block's threads copy n elements src -> dst, converting and scaling.
template <typename S, typename D>
__device__ void CopyRun(const S* __restrict__ src, D* __restrict__ dst, int64_t n, float scale) {
  const int64_t t = threadIdx.x;
  const int64_t src_elem = static_cast<int64_t>(reinterpret_cast<uintptr_t>(src) / sizeof(S));
  int64_t head = (kVec - src_elem % kVec) % kVec;  // elements until src is vector-aligned
  if (head > n) head = n;
  const bool vec = n - head >= kVec && VecAligned<D>(dst + head);
  if (!vec) head = n;  // src and dst disagree on alignment: element by element
  for (int64_t i = t; i < head; i += kThreads) dst[i] = FromF32<D>(ToF32(src[i]) * scale);
  if (!vec) return;
  const int64_t nv = (n - head) / kVec;
  const Vec4<S>* vs = reinterpret_cast<const Vec4<S>*>(src + head);
  Vec4<D>* vd = reinterpret_cast<Vec4<D>*>(dst + head);
  int64_t j = t;
  for (; j + (kUnroll - 1) * kThreads < nv; j += kUnroll * kThreads) {
    Vec4<S> r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = vs[j + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) vd[j + u * kThreads] = Convert<S, D>(r[u], scale);
  }
  for (; j < nv; j += kThreads) vd[j] = Convert<S, D>(vs[j], scale);
  for (int64_t i = head + nv * kVec + t; i < n; i += kThreads)
    dst[i] = FromF32<D>(ToF32(src[i]) * scale);
}

template <bool kPack, typename B>
__global__ void __launch_bounds__(kThreads)
    PackKernel(const Span* __restrict__ spans, int64_t num_spans, int64_t total, B* buf,
               float scale) {
  const int64_t tile_lo = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t tile_hi = min(tile_lo + kTile, total);
  __shared__ int64_t first;
  if (threadIdx.x == 0) {  // last span with begin <= tile_lo
    int64_t lo = 0, hi = num_spans - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (spans[mid].begin <= tile_lo) lo = mid; else hi = mid - 1;
    }
    first = lo;
  }
  __syncthreads();
  for (int64_t s = first; s < num_spans; ++s) {
    const Span sp = spans[s];
    if (sp.begin >= tile_hi) break;
    const int64_t a = max(tile_lo, sp.begin) - sp.begin;
    const int64_t b = min(tile_hi, sp.begin + sp.len) - sp.begin;
    if (b <= a) continue;
    B* at = buf + sp.buf_off + a;
    DispatchDTypeOnDevice(sp.leaf_dtype, [&](auto leaf_zero) {
      using L = decltype(leaf_zero);
      L* leaf = static_cast<L*>(sp.leaf) + a;
      if constexpr (kPack) CopyRun<L, B>(leaf, at, b - a, scale);
      else CopyRun<B, L>(at, leaf, b - a, scale);
    });
  }
}

template <bool kPack>
cudaError_t Launch(const Span* spans, int64_t num_spans, int64_t total, const void* buf,
                   DType buf_dtype, float scale, cudaStream_t stream) {
  if (total <= 0 || num_spans <= 0) return cudaSuccess;
  const int64_t blocks = (total + kTile - 1) / kTile;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  DispatchDType(buf_dtype, [&](auto buf_zero) {
    using B = decltype(buf_zero);
    PackKernel<kPack, B><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        spans, num_spans, total, static_cast<B*>(const_cast<void*>(buf)), scale);
  });
  return cudaGetLastError();
}

}  // namespace

int64_t SetBegins(Span* spans, int64_t n) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    spans[i].begin = total;
    total += spans[i].len;
  }
  return total;
}

cudaError_t LaunchPack(const Span* spans, int64_t num_spans, int64_t total, void* buf,
                       DType buf_dtype, float scale, cudaStream_t stream) {
  return Launch<true>(spans, num_spans, total, buf, buf_dtype, scale, stream);
}

cudaError_t LaunchUnpack(const void* buf, DType buf_dtype, const Span* spans,
                         int64_t num_spans, int64_t total, float scale, cudaStream_t stream) {
  return Launch<false>(spans, num_spans, total, buf, buf_dtype, scale, stream);
}

}  // namespace coarse::kernels
