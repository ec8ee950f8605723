// Groups of pieces the proxies' ring steps together (runtime/ring.h:
// RingMember::rows): work per push, not per piece. A group is consecutive
// pieces of one push (Plan::piece_push: one call, so they land together;
// the shards of one leaf, or of several leaves a push batches, Config.push_bytes),
// of equal length, reduced through the ring (no DENSE holder), laid out at one pitch
// in every proxy's storage (the same number of slots per piece), and at most
// RingGroupFloats() floats (4 MiB of f32 by default: the pull's bound per
// wait, pull_pieces.cc), past which a push's pieces form several groups, so
// a big push's ring still overlaps its tail. Every proxy derives the same
// groups from the plan, so their counters agree. Each group starts as soon
// as its pieces' pushes are there.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/plan.h"

namespace coarse {

struct RingGroup {
  int64_t first = 0;  // its first piece
  int64_t count = 1;  // pieces first .. first + count - 1
};

// The plan's pieces in groups, in order; pieces with different `kind(s)`
// (the proxy optimizer's: updated or not) never share one. A bound of 0 or
// less (or one proxy) puts each piece in a group of its own.
std::vector<RingGroup> RingGroups(const Plan& plan, int64_t max_floats,
                                  const std::function<int(int64_t)>& kind);

// The bound in force (floats); testing may change it (SetRingGroupFloats,
// coarse_jax._ffi.stream_ops.set_ring_group_floats): 0 steps the ring
// piece by piece, as before groups, which the step budgets must catch.
int64_t RingGroupFloats();
// Sets it; returns the previous bound; a negative value restores the default.
int64_t SetRingGroupFloats(int64_t floats);

}  // namespace coarse
