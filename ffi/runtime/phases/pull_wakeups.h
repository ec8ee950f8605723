// PullWakeups: when a proxy wakes the pulls that read its pieces.
//
// A worker's pull waits for its pieces one by one (phases/pull_pieces.cc).
// Woken for every piece a proxy makes final, a parked pull would be handed
// off to once per piece: on a GPU host each wake-up is host time on the path
// that enqueues the next launch. A proxy instead wakes them once per pull
// group (PullGroups, phases.h: consecutive pieces up to 4 MiB), when it has
// made the group's last piece final. No wake-up is lost: a parked pull waits
// for a piece this proxy has not made final, so the group of that piece is
// not final here yet, and its last piece's Final comes after (Mailbox's
// rule: the waker notifies after the state the waiter reads). Smaller
// pieces do not add groups, so halving shard_bytes adds no hand-off.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/faults.h"
#include "runtime/phases.h"

namespace coarse {

class PullWakeups {
 public:
  // For proxy `k` of `plan`; `gather_pull`: every worker reads every
  // proxy's pieces (GatherPull), else the workers routed to `k` do.
  PullWakeups(const Plan& plan, int64_t k, bool gather_pull)
      : groups_(PullGroups(plan)), left_(groups_.size), pullers_(plan.workers, gather_pull) {
    for (int64_t s = 0; s < plan.num_pieces(); ++s)
      for (int32_t w : plan.contributors_of(k, s)) pullers_[w] = true;
  }

  // Piece s is final on this proxy for the pulls that read it (called once
  // per piece; returns Success, for the branch that finishes it). On emulated links, whose schedule
  // books each pull from its piece's reduction, the pulls are woken per piece, as they are under
  // the testing fault kNotifyPerPiece.
  Status Final(Session& session, int64_t s) {
    if (--left_[groups_.of[s]] == 0 || session.emulated() || NotifiesPerPiece())
      for (int64_t w = 0; w < static_cast<int64_t>(pullers_.size()); ++w)
        if (pullers_[w]) session.Notify(w);
    return Status::Success();
  }

 private:
  const PullGroupsOf groups_;
  std::vector<int64_t> left_;  // per group: its pieces not yet final here
  std::vector<bool> pullers_;  // the workers whose pull reads this proxy's pieces
};

}  // namespace coarse
