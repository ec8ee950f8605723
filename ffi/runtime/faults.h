// Deliberate faults the budget tests must catch (coarse_jax.testing's
// deliberate_fault): each brings an old cost back, so a test that holds a
// budget shows it fails without the change that removed the cost. All off
// unless a test turns one on; one process-wide switch, read per call.
#pragma once

#include <cstdint>

namespace coarse {

enum class Fault : int64_t {
  kNone = 0,
  // A push wakes its proxies once per piece, a proxy the pulls once per
  // piece (phases/push_pieces.cc, phases/reduce_pieces.cc), as before hand-
  // offs were per call.
  kNotifyPerPiece = 1,
  // Global-norm clipping reads each owned range's sum of squares back to the
  // host (a host synchronization per range: phases/update_pieces.cc).
  kClipSyncPerPiece = 2,
};

// Sets the active faults (a mask of Fault values); returns the previous mask.
int64_t SetFaults(int64_t mask);
bool HasFault(Fault fault);

// The two the phases read.
inline bool NotifiesPerPiece() { return HasFault(Fault::kNotifyPerPiece); }
inline bool ClipSyncsPerPiece() { return HasFault(Fault::kClipSyncPerPiece); }

}  // namespace coarse
