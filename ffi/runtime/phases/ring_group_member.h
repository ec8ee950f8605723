// A ring group (runtime/ring_groups.h) as one proxy's member of the two
// rings (runtime/ring.h: RingMember), and the waits on its pushes, for
// phases/reduce_pieces.cc: where a group's pieces lie in every proxy's
// storage, which counters step it, and what a wait on it names.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/call.h"
#include "runtime/ring.h"
#include "runtime/ring_groups.h"
#include "runtime/session.h"

namespace coarse {

// Proxy j's storage distance between consecutive pieces of group g (floats;
// 0 for a group of one piece).
int64_t GroupPitch(const Plan& plan, int64_t j, const RingGroup& g);

// Proxy k's member of the rings that step group g: its rows, its own and
// its predecessors' storage, the counters of g's first piece (and the stride
// to the next piece's), the devices and positions.
RingMember GroupMember(Session& session, int64_t k, const RingGroup& g);

// What a ring step of group g waits for, as a timeout names it
// (ring r, step index within the ring).
std::function<std::string(int, int32_t)> GroupStepWhat(const Plan& plan, int64_t k,
                                                       const RingGroup& g);

// Until every client routed to proxy j has pushed piece s; a timeout names
// exactly the clients whose push is missing (Session::pushed).
Status AwaitPushes(const Call& call, int64_t j, int64_t s,
                   Session::Waits kind = Session::Waits::kPush);

}  // namespace coarse
