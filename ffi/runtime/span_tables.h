// Span tables kept resident in a device's memory, and which table each
// slot holds (see SpanTables).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/span.h"

namespace coarse {

// A device's span tables in its memory (StreamResources::spans): kSpanTables
// slots of max_runs() spans each, and which table each slot holds (a host
// copy). A merged pack or unpack whose table a slot already holds launches
// on that slot with no upload (StreamDevice::Flush): a step's calls repeat
// their tables step after step wherever XLA gives the leaves' buffers the
// same addresses again, and then the uploads are made once, not per call
// (how often it does is measured in the performance guide). A slot is refilled least recently used
// first; the upload that refills it is enqueued after every launch that read it, on the same
// stream. Touched only by the device's own calls, one after another.
inline constexpr int kSpanTables = 16;
class SpanTables {
 public:
  // The slot holding `table` (n spans), or -1.
  int Find(const kernels::Span* table, int64_t n);
  // The least recently used slot, which now holds `table`: the caller uploads it.
  int Claim(const kernels::Span* table, int64_t n);
  // Slot `slot` holds nothing known (its upload failed).
  void Forget(int slot) { used_[slot] = 0; }

 private:
  std::vector<kernels::Span> held_[kSpanTables];
  uint64_t used_[kSpanTables] = {};  // when each slot was last found or claimed; 0 never
  uint64_t clock_ = 0;
};

}  // namespace coarse
