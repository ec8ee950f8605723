// Ring all-reduce over f32 buffers, used both by the proxies (per piece) and
// by the workers (leading layers), on any Device (runtime/device.h).
//
// Two rings run in opposite directions, each on one half of the buffer, so
// every link carries data both ways (the paper's two sync-core groups).
// Each half is cut into p chunks; p-1 reduce-scatter steps then p-1
// all-gather steps. In step g a member reads its ring predecessor's buffer
// directly (the "transfer" is that read) once the predecessor has completed
// g steps. The order of additions depends only on ring positions, so results
// are bitwise reproducible run to run.
//
// A member may be a group of `rows` buffers of n floats each (the proxies'
// pieces of one push, RingGroups in runtime/ring_groups.h): every step then
// moves the same chunk of each of them, one copy and one launch for the
// group (Rows, runtime/device.h), and the group's counters advance together.
// Each buffer's chunks, and so the order of its additions, are those of its
// own ring: the bits are a lone buffer's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/device.h"
#include "runtime/session.h"

namespace coarse {

struct RingMember {
  int64_t members = 0;                     // ring size: q proxies, or p workers
  float* own;                              // this member's buffer, n floats
  const float* pred[2];                    // ring r predecessor's buffer
  std::atomic<int32_t>* progress[2];       // steps this member completed, per ring
  std::atomic<int32_t>* pred_progress[2];  // same for the ring r predecessor
  // A group of `rows` buffers (see the top of this file): buffer i at own +
  // i * own_pitch, its predecessor's at pred[r] + i * pred_pitch[r] (floats),
  // its counters at progress[r] + i * progress_stride (pred_progress alike).
  // Not with emulated links (step_times), which book one buffer a step.
  int64_t rows = 1;
  int64_t own_pitch = 0;
  int64_t pred_pitch[2] = {0, 0};
  int64_t progress_stride = 0;
  int64_t successor_device[2];          // whom to wake after a step
  int64_t position[2];                  // position in ring r, 0..p-1
  int64_t self_device, pred_device[2];  // mesh devices: peer copies, emulated links
  double wire_bytes_per_elem;           // bytes a chunk element costs on a link
  // Emulated links only (else null): when this member's / its predecessor's
  // progress in ring r reached g, RingSteps(p) + 1 entries (Session's
  // *_step_times). A step's transfer is ready when both were there.
  std::atomic<int64_t>* step_times[2] = {nullptr, nullptr};
  const std::atomic<int64_t>* pred_step_times[2] = {nullptr, nullptr};
  // Emulated links: when the member's starting values existed, if earlier
  // than when it joins the ring (a worker widens its leaves into `own`
  // first; on a GPU the ring would read them in place). Step 0 is booked
  // from then, so that host copy lies inside the first transfer's window.
  std::optional<Clock::time_point> values_ready;
  // Called with [lo, hi) (elements of `own`) as soon as that range holds its
  // final value, inside the transfer window of the step that produced it, so
  // a member can copy results out while the links, not the host, set the
  // time. Ranges arrive in ring step order and cover [0, n) once. Only for
  // members whose reduce-scatter result is final (announce = true).
  std::function<Status(int64_t lo, int64_t hi)> on_final;
};

// The chunk [*lo, *hi) of `own` that the member at `position` in ring r
// (0..p-1) of an n-element ring reads at step g: reduce-scatter steps add
// into it, all-gather steps copy it.
void RingChunk(int ring, int32_t g, int64_t position, int64_t p, int64_t n, int64_t* lo,
               int64_t* hi);
// Final chunks (RingAllReduce): once a member has completed step g + 1 of
// ring r, for g = p - 2 .. RingSteps(p) - 1, RingChunk(r, g, ...) holds its
// final value (at p - 2 the chunk it owns after the reduce-scatter, then the
// one each all-gather step copied); together they cover the ring's half.

// Position of member `index` of p in ring r: ring 0 runs 0->1->..->p-1->0,
// ring 1 the other way round.
inline int64_t RingPosition(int ring, int64_t index, int64_t p) {
  return ring == 0 ? index : (p - index) % p;
}
inline int64_t RingPredecessor(int ring, int64_t index, int64_t p) {
  return ring == 0 ? (index + p - 1) % p : (index + 1) % p;
}
inline int64_t RingSuccessor(int ring, int64_t index, int64_t p) {
  return RingPredecessor(1 - ring, index, p);
}

// The chunk [*lo, *hi) member `index` owns after the reduce-scatter of ring r
// (the one its last reduce-scatter step completes); returns its number c,
// (position + 1) % p, of the ring's half.
inline int64_t OwnedChunk(int ring, int64_t index, int64_t p, int64_t n, int64_t* lo, int64_t* hi) {
  const int64_t position = RingPosition(ring, index, p);
  RingChunk(ring, static_cast<int32_t>(p - 2), position, p, n, lo, hi);
  return (position + 1) % p;
}

// The members in the order ring r adds chunk c of its half: the member at
// position c first, then c + 1, ..., the chunk's owner (position c - 1)
// last; order[0..p). A one-pass reduce-scatter that adds in this order
// (SharedMemory::SumInRingOrder) gives the ring's bits.
inline void RingAddOrder(int ring, int64_t c, int64_t p, int64_t* order) {
  for (int64_t t = 0; t < p; ++t) {
    const int64_t pos = (c + t) % p;
    order[t] = ring == 0 ? pos : (p - pos) % p;
  }
}

// Marks the member ready (progress 0) and runs all steps. The member that
// completes a chunk's sum (last reduce-scatter step) multiplies it by `scale`
// in the same pass, so the mean costs no extra pass and readers can copy the
// result as is. `what(ring, step)` names what a wait was for, for the timeout
// error.
Status RingAllReduce(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                     const RingMember& m, FunctionRef<std::string(int, int32_t)> what);

// The two halves of RingAllReduce, for a member that changes the chunks it
// owns in between (the proxy optimizer turns its mean gradient into new
// parameters, which the all-gather then circulates). After
// RingReduceScatter the member owns chunk (position + 1) % p of each half,
// fully reduced and scaled. With `announce` its successors may read it at
// once; without, only once RingAnnounceOwned says it is final. Then
// RingAllGather finishes.
Status RingReduceScatter(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                         const RingMember& m, FunctionRef<std::string(int, int32_t)> what,
                         bool announce);
Status RingAnnounceOwned(Session& session, Device& dev, const RingMember& m);
Status RingAllGather(Session& session, Device& dev, const Who& who, int64_t n, const RingMember& m,
                     FunctionRef<std::string(int, int32_t)> what);

}  // namespace coarse
