// coarse_host_gather's XLA translation. After the XLA collective over "host"
// (coarse_jax/api/_hosts.py) worker k of a host holds chunk k of the synced
// leaves laid end to end (chunks of `chunk` elements), summed over hosts, in
// f32. Every worker of the host offers its chunk (runtime/hand_out.h) and
// writes every chunk into its results, the leaves in their own dtypes
// (Device::Scatter narrows from f32), so no XLA copy follows.
#include "xla/host_gather.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/emulator.h"
#include "runtime/hand_out.h"
#include "runtime/leaf_runs.h"
#include "runtime/traffic.h"
#include "xla/handler.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// An emulated inter-host link (InterHostLinkAttrs; coarse.Topology
// inter_host_*): every device of
// the host waits until the host's NIC has carried, each way, (hosts - 1)
// times the host's f32 result (`elems`: every synced leaf, no padding),
// booked from when the host's own synchronization ended. The XLA collective
// before this call moved the bytes for real in the meantime; the hand-out
// above also ran inside the window. Real clock only: a virtual-clock
// topology does not time the inter-host step (coarse_jax/model/hosts.py).
ffi::Error ChargeInterHostLink(int64_t run_id, int64_t site, const InterHostLinkAttrs& link,
                               int64_t elems) {
  if (!link.emulated || link.virtual_clock) return ffi::Error::Success();
  const std::optional<Clock::time_point> ready = SyncEnd(run_id, site);
  if (!ready)
    return ffi::Error::Internal(
        "coarse_host_gather: no emulated in-host synchronization of this step ended before the "
        "inter-host step (Config(topology=...) must be the same for both)");
  const double nbytes = static_cast<double>(link.hosts - 1) * 4.0 * static_cast<double>(elems);
  const double seconds = link.latency_s + nbytes * link.s_per_byte;
  SleepUntil(*ready +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  return ffi::Error::Success();
}

}  // namespace

ffi::Error HostGatherBody(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer chunk,
                          ffi::RemainingRets outs, const HostGatherAttrs& attrs, Stream& host) {
  const int64_t p = attrs.workers, site = attrs.site, timeout_ms = attrs.timeout_ms,
                c = attrs.chunk;
  auto me = ReadWho(who, p, p);
  if (me.has_error()) return me.error();
  const int64_t width = static_cast<int64_t>(chunk.element_count());
  if (chunk.element_type() != ffi::DataType::F32 || c < 0 || c > width)
    return ffi::Error::InvalidArgument(
        "coarse_host_gather: operand 1 must be f32[width], width >= attribute chunk");
  std::vector<LeafRun> leaves;  // each leaf at its offset end to end
  int64_t total = 0;
  for (size_t a = 0; a < outs.size(); ++a) {
    auto out = outs.get<ffi::AnyBuffer>(a);
    if (out.has_error()) return out.error();
    const ffi::DataType dtype = out.value()->element_type();
    if (!IsSupported(dtype))
      return ffi::Error::InvalidArgument("coarse_host_gather: result " + std::to_string(a) +
                                         " is " + DtypeName(dtype) +
                                         ", expected float32, bfloat16 or float16");
    const int64_t n = static_cast<int64_t>(out.value()->element_count());
    leaves.push_back(LeafRun{out.value()->untyped_data(), *AsDType(dtype), n, total});
    total += n;
  }
  if (total > p * c)
    return ffi::Error::InvalidArgument(
        "coarse_host_gather: the leaves hold more elements than p chunks (attribute chunk)");
  Status failed = Status::Success();
  std::vector<kernels::Span> spans;
  auto take = [&](int64_t k, const void* src) {
    std::vector<LeafRun> runs = ClipRuns(leaves, k * c, (k + 1) * c, k * c);
    if (runs.empty()) return;
    int64_t n = 0;
    Status e = SpansOf(runs.data(), static_cast<int64_t>(runs.size()), &spans, &n);
    if (e.success()) {
      CountScatter(runs.data(), static_cast<int64_t>(runs.size()));
      e = host.Unpack(static_cast<const float*>(src), spans.data(),
                      static_cast<int64_t>(spans.size()), n);
    }
    if (e.failure() && failed.success()) failed = std::move(e);
  };
  auto describe = [](int64_t k) { return Who{kWorker, k}.Describe(); };
  Status status = HandOut(run_id.run_id, site, me.value().index, p, chunk.untyped_data(),
                          timeout_ms, take, describe);
  if (status.failure()) return ToXlaError(status);
  if (failed.failure()) return ToXlaError(failed);
  return ChargeInterHostLink(run_id.run_id, site, attrs.link, total);
}

}  // namespace coarse
