// TraceScope and the process's span buffer (see trace.h).
#include "runtime/trace.h"

#include <deque>
#include <mutex>
#include <utility>

#include "runtime/session.h"

namespace coarse {

namespace {

std::mutex g_mu;
std::deque<TraceEvent>& Events() {
  static auto* events = new std::deque<TraceEvent>;
  return *events;
}

int64_t Ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

TraceScope::TraceScope(const Session& session, int64_t device, const char* name, int64_t piece,
                       int64_t bytes)
    : session_(session.plan().trace ? &session : nullptr),
      device_(device),
      piece_(piece),
      bytes_(bytes),
      name_(name) {
  if (session_) begin_ = std::chrono::steady_clock::now();
}

TraceScope::~TraceScope() {
  if (!session_) return;
  const auto end = std::chrono::steady_clock::now();
  TraceEvent e{
      device_,          session_->p(),         name_,      piece_, bytes_, session_->step(),
      session_->site(), session_->iteration(), Ns(begin_), Ns(end)};
  std::lock_guard<std::mutex> lock(g_mu);
  if (Events().size() >= kMaxTraceEvents) Events().pop_front();
  Events().push_back(std::move(e));
}

std::vector<TraceEvent> TakeTrace() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<TraceEvent> out(Events().begin(), Events().end());
  Events().clear();
  return out;
}

}  // namespace coarse
