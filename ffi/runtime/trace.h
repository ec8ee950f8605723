// The step timeline (Config(trace=True), coarse_jax/api/timeline.py): every
// device records spans of what it did, per phase and piece, with host
// steady-clock start and end times and the bytes moved; Python takes them and
// writes a Chrome / Perfetto trace.
//
// Off unless the plan says so (attribute trace=1): a TraceScope of an
// untraced plan is one branch. Spans of a device nest (a phase encloses its
// pieces, a piece its waits), which tests check.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace coarse {

class Session;

struct TraceEvent {
  int64_t device;  // mesh device: worker i -> i, proxy k -> p + k
  int64_t workers;
  std::string name;  // "push", "proxy ring", "reduce-scatter", "wait for pushes", ...
  int64_t piece;     // -1: not about one piece
  int64_t bytes;     // moved by this span (0: none, e.g. a wait)
  int64_t step, site, iteration;
  int64_t begin_ns, end_ns;  // steady clock
};

// Records [construction, destruction) as one span if the session's plan traces.
class TraceScope {
 public:
  TraceScope(const Session& session, int64_t device, const char* name, int64_t piece = -1,
             int64_t bytes = 0);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  const Session* session_;  // null: not tracing
  int64_t device_, piece_, bytes_;
  const char* name_;
  std::chrono::steady_clock::time_point begin_;
};

// Returns and forgets the spans recorded so far (at most kMaxTraceEvents are
// kept; the oldest are dropped first).
std::vector<TraceEvent> TakeTrace();
inline constexpr size_t kMaxTraceEvents = 1 << 20;

}  // namespace coarse
