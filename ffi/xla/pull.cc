// coarse_pull's XLA translation: checks every result (one per proxy leaf)
// against the plan and runs PullPieces (runtime/phases/pull_pieces.cc) into
// them. The proxy-leaf operands alias the results, or, when the proxies read
// the pushes in place, are the pushed leaves, checked to be where they were
// pushed from (PushesInPlace, runtime/phases.h).
#include "runtime/phases.h"
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error PullBody(Call& call, Device& dev, ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                    bool push_in_place) {
  const Plan& plan = call.plan();
  if (static_cast<int64_t>(outs.size()) != plan.num_proxy_leaves)
    return ffi::Error::InvalidArgument("coarse_pull: expected one result per proxy leaf");
  for (size_t a = 0; a < outs.size(); ++a) {
    auto out = outs.get<ffi::AnyBuffer>(a);
    if (out.has_error()) return out.error();
    ffi::Error e = ToXlaError(CheckLeaf(plan, a, AsDType(out.value()->element_type()),
                                        out.value()->element_count(), "coarse_pull"));
    if (e.failure()) return e;
  }
  const LeafResolver out_of = [&](int64_t leaf) {
    ffi::Result<ffi::AnyBuffer> out = outs.get<ffi::AnyBuffer>(leaf).value();
    return LeafRef{out->untyped_data(), *AsDType(out->element_type())};  // checked above
  };
  if (!PushesInPlace(*call.session, push_in_place))
    return ToXlaError(PullPieces(call, dev, out_of));
  if (leaves.size() != outs.size())
    return ffi::Error::InvalidArgument(
        "coarse_pull: push_in_place=1 needs the pushed leaves as operands, one per result");
  for (size_t a = 0; a < leaves.size(); ++a) {
    auto in = leaves.get<ffi::AnyBuffer>(a);
    if (in.has_error()) return in.error();
    // Read in their own dtype by PullPieces: checked as the results are.
    ffi::Error e = ToXlaError(CheckLeaf(plan, a, AsDType(in.value().element_type()),
                                        in.value().element_count(), "coarse_pull"));
    if (e.failure()) return e;
  }
  const LeafResolver pushed = [&](int64_t leaf) {
    ffi::AnyBuffer in = leaves.get<ffi::AnyBuffer>(leaf).value();
    return LeafRef{in.untyped_data(), *AsDType(in.element_type())};  // checked above
  };
  return ToXlaError(PullPieces(call, dev, out_of, &pushed));
}

}  // namespace coarse
