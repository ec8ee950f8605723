// pack / unpack: one launch moves every span between leaves and a packed buffer.
//
// The packed buffer's element space (the concatenation of the spans, in
// order) is cut into tiles of kTile elements, one block each. A block finds
// the span holding its first element by binary search over Span::begin, then
// walks spans until its tile ends. Within a span the block's threads move 4
// elements at a time (16-byte f32 / 8-byte bf16,f16 accesses, coalesced),
// with several loads in flight per thread before the first store; misaligned
// heads and tails go element by element. A run shorter than kSmallRun is
// moved by one warp, the block's warps taking such runs in turn, so a tile
// of many small leaves keeps all its warps busy instead of one run at a
// time. So 2,000 tiny leaves and one 64 MiB leaf are both a single launch
// with no per-leaf host work.
#include "coarse_kernels.h"
#include "elementwise.cuh"

namespace coarse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTile = 16384;  // elements per block: 16 vectors per thread
constexpr int kUnroll = 4;        // vector loads in flight per thread
constexpr int kWarps = kThreads / 32;
constexpr int64_t kSmallRun = 2048;  // elements: below this a single warp moves the run

template <typename S, typename D>
__device__ __forceinline__ Vec4<D> Convert(const Vec4<S>& x, float scale) {
  Vec4<D> y;
#pragma unroll
  for (int e = 0; e < kVec; ++e) y.v[e] = FromF32<D>(PackValue(ToF32(x.v[e]), scale));
  return y;
}

// `kGroup` threads (the block, or one warp; `t` is the thread's rank in it)
// copy n elements src -> dst, converting and scaling.
template <int kGroup, typename S, typename D>
__device__ void CopyRun(const S* __restrict__ src, D* __restrict__ dst, int64_t n, float scale,
                        int64_t t) {
  const int64_t src_elem = static_cast<int64_t>(reinterpret_cast<uintptr_t>(src) / sizeof(S));
  int64_t head = (kVec - src_elem % kVec) % kVec;  // elements until src is vector-aligned
  if (head > n) head = n;
  const bool vec = n - head >= kVec && VecAligned<D>(dst + head);
  if (!vec) head = n;  // src and dst disagree on alignment: element by element
  for (int64_t i = t; i < head; i += kGroup) dst[i] = FromF32<D>(PackValue(ToF32(src[i]), scale));
  if (!vec) return;
  const int64_t nv = (n - head) / kVec;
  const Vec4<S>* vs = reinterpret_cast<const Vec4<S>*>(src + head);
  Vec4<D>* vd = reinterpret_cast<Vec4<D>*>(dst + head);
  int64_t j = t;
  for (; j + (kUnroll - 1) * kGroup < nv; j += kUnroll * kGroup) {
    Vec4<S> r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = vs[j + u * kGroup];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) vd[j + u * kGroup] = Convert<S, D>(r[u], scale);
  }
  for (; j < nv; j += kGroup) vd[j] = Convert<S, D>(vs[j], scale);
  for (int64_t i = head + nv * kVec + t; i < n; i += kGroup)
    dst[i] = FromF32<D>(PackValue(ToF32(src[i]), scale));
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
      if (spans[mid].begin <= tile_lo)
        lo = mid;
      else
        hi = mid - 1;
    }
    first = lo;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int small = 0;  // small runs seen so far in this tile: run i goes to warp i % kWarps
  for (int64_t s = first; s < num_spans; ++s) {
    const Span sp = spans[s];
    if (sp.begin >= tile_hi) break;
    const int64_t a = max(tile_lo, sp.begin) - sp.begin;
    const int64_t b = min(tile_hi, sp.begin + sp.len) - sp.begin;
    if (b <= a) continue;
    const bool by_warp = b - a < kSmallRun;  // the same answer in every thread
    if (by_warp && small++ % kWarps != warp) continue;
    B* at = buf + sp.buf_off + a;
    DispatchDTypeOnDevice(sp.leaf_dtype, [&](auto leaf_zero) {
      using L = decltype(leaf_zero);
      L* leaf = static_cast<L*>(sp.leaf) + a;
      if (by_warp) {
        if constexpr (kPack)
          CopyRun<32, L, B>(leaf, at, b - a, scale, lane);
        else
          CopyRun<32, B, L>(at, leaf, b - a, scale, lane);
      } else {
        if constexpr (kPack)
          CopyRun<kThreads, L, B>(leaf, at, b - a, scale, threadIdx.x);
        else
          CopyRun<kThreads, B, L>(at, leaf, b - a, scale, threadIdx.x);
      }
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

cudaError_t LaunchPack(const Span* spans, int64_t num_spans, int64_t total, void* buf,
                       DType buf_dtype, float scale, cudaStream_t stream) {
  return Launch<true>(spans, num_spans, total, buf, buf_dtype, scale, stream);
}

cudaError_t LaunchUnpack(const void* buf, DType buf_dtype, const Span* spans, int64_t num_spans,
                         int64_t total, float scale, cudaStream_t stream) {
  return Launch<false>(spans, num_spans, total, buf, buf_dtype, scale, stream);
}

}  // namespace coarse::kernels
