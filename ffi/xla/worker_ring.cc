// coarse_worker_ring's XLA translation: lays the leading leaves (operands and
// results) end to end as runs of the f32 scratch,
// checked against the plan, runs ReduceLeading
// (runtime/phases/reduce_leading.cc) and zeroes the token result.
#include <optional>
#include <vector>

#include "runtime/phases.h"
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

// The leading leaves (operands or results) laid end to end in the scratch.
static ffi::ErrorOr<std::vector<LeafRun>> LeadingRuns(const Plan& plan,
                                                      const std::vector<ffi::AnyBuffer>& bufs) {
  std::vector<LeafRun> runs;
  int64_t off = 0;
  for (size_t a = 0; a < bufs.size(); ++a) {
    const int64_t leaf = plan.num_proxy_leaves + static_cast<int64_t>(a);
    const std::optional<DType> dtype = AsDType(bufs[a].element_type());
    Status e = CheckLeaf(plan, leaf, dtype, bufs[a].element_count(), "coarse_worker_ring");
    if (e.failure()) return ffi::Unexpected(ToXlaError(e));
    const int64_t n = static_cast<int64_t>(bufs[a].element_count());
    runs.push_back(LeafRun{bufs[a].untyped_data(), *dtype, n, off});
    off += n;
  }
  return runs;
}

ffi::Error WorkerRingBody(Call& call, Device& dev, ffi::RemainingArgs leaves,
                          ffi::RemainingRets outs) {
  const Plan& plan = call.plan();
  const int64_t first = plan.num_proxy_leaves;
  const int64_t L = static_cast<int64_t>(plan.leaf_nelems.size()) - first;
  if (static_cast<int64_t>(leaves.size()) != L || static_cast<int64_t>(outs.size()) != L + 1)
    return ffi::Error::InvalidArgument(
        "coarse_worker_ring: expected one operand per leading leaf and a token result");
  std::vector<ffi::AnyBuffer> ins, results;
  for (int64_t a = 0; a < L; ++a) {
    ins.push_back(leaves.get<ffi::AnyBuffer>(a).value());
    results.push_back(*outs.get<ffi::AnyBuffer>(a).value());
  }
  auto in_runs = LeadingRuns(plan, ins);
  if (in_runs.has_error()) return in_runs.error();
  auto out_runs = LeadingRuns(plan, results);
  if (out_runs.has_error()) return out_runs.error();
  Status err = ReduceLeading(call, dev, in_runs.value(), out_runs.value());
  if (err.failure()) return ToXlaError(err);
  ffi::Result<ffi::AnyBuffer> token = outs.get<ffi::AnyBuffer>(L).value();
  return ToXlaError(dev.ZeroBytes(token->untyped_data(), token->size_bytes()));
}

}  // namespace coarse
