// ExchangeOwned (see exchange_owned.h).
#include "runtime/phases/exchange_owned.h"

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/param_store.h"
#include "runtime/trace.h"

namespace coarse {

Status ExchangeOwned(Session& session, Device& dev, int64_t k, const HostsStage& hosts,
                     bool to_hosts) {
  const Plan& plan = session.plan();
  const std::vector<OwnedRange> ranges = ExchangeRanges(plan, k);
  const int64_t n = ranges.empty() ? 0 : ranges.back().off + (ranges.back().hi - ranges.back().lo);
  if (n > hosts.width)
    return Status::Internal(
        "coarse_jax: coarse_proxy_ring across hosts: proxy " + std::to_string(k) + " owns " +
        std::to_string(n) + " elements after the reduce-scatter but the exchange buffer has " +
        std::to_string(hosts.width) +
        " (the step was built from another plan than the one that runs: coarse_jax reads "
        "the width from ExchangeRanges, ffi/runtime/param_store.cc)");
  TraceScope span(session, plan.workers + k,
                  to_hosts ? "to the other hosts" : "from the other hosts", -1, n * 4);
  for (const OwnedRange& r : ranges) {
    float* own = session.arena(k) + plan.slot(k, r.piece, 0) + r.lo;
    float* x = hosts.chunks + r.off;
    const size_t bytes = static_cast<size_t>(r.hi - r.lo) * sizeof(float);
    // `x` is host memory (the session's chunks), `own` this proxy's storage.
    Status err = to_hosts ? dev.CopyToHost(x, own, bytes) : dev.CopyFromHost(own, x, bytes);
    if (err.failure()) return err;
  }
  if (to_hosts && hosts.width > n)  // host memory: the host zeroes it
    std::fill(hosts.chunks + n, hosts.chunks + hosts.width, 0.0f);
  return Status::Success();
}

}  // namespace coarse
