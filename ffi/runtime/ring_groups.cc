// RingGroups (see ring_groups.h).
#include "runtime/ring_groups.h"

#include <atomic>

namespace coarse {

namespace {

constexpr int64_t kDefaultGroupFloats = int64_t{1} << 20;  // 4 MiB of f32
std::atomic<int64_t> g_group_floats{kDefaultGroupFloats};

// Whether piece t is in piece t - 1's push (so they land together).
bool SamePush(const Plan& plan, int64_t t) { return plan.piece_push[t] == plan.piece_push[t - 1]; }

// Proxy j's storage distance from piece t - 1 to piece t (floats).
int64_t Pitch(const Plan& plan, int64_t j, int64_t t) {
  return plan.slot(j, t, 0) - plan.slot(j, t - 1, 0);
}

}  // namespace

std::vector<RingGroup> RingGroups(const Plan& plan, int64_t max_floats,
                                  const std::function<int(int64_t)>& kind) {
  const int64_t S = plan.num_pieces(), q = plan.proxies;
  std::vector<RingGroup> out;
  for (int64_t s = 0; s < S;) {
    RingGroup g{s, 1};
    const int64_t n = plan.piece_nelems[s];
    auto joins = [&](int64_t t) {
      if (q < 2 || plan.piece_holder[t] >= 0 || plan.piece_holder[s] >= 0) return false;
      if (plan.piece_nelems[t] != n || (g.count + 1) * n > max_floats) return false;
      if (!SamePush(plan, t) || kind(t) != kind(s)) return false;
      for (int64_t j = 0; j < q; ++j) {
        if (plan.contributors_of(j, t).size() != plan.contributors_of(j, s).size()) return false;
        if (plan.contributors_of(j, t).empty()) return false;  // zero-filled: not a row of slots
        if (g.count > 1 && Pitch(plan, j, t) != Pitch(plan, j, s + 1)) return false;
      }
      return true;
    };
    while (s + g.count < S && joins(s + g.count)) ++g.count;
    out.push_back(g);
    s += g.count;
  }
  return out;
}

int64_t RingGroupFloats() { return g_group_floats.load(std::memory_order_relaxed); }

int64_t SetRingGroupFloats(int64_t floats) {
  return g_group_floats.exchange(floats < 0 ? kDefaultGroupFloats : floats,
                                 std::memory_order_relaxed);
}

}  // namespace coarse
