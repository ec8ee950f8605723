// Session and its registry (see session.h): storage, counters, mailboxes,
// waits with deadlines, the emulated clocks, and the testing hooks.
#include "runtime/session.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "runtime/ring.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

template <typename T>
std::unique_ptr<std::atomic<T>[]> Counters(size_t n, T init) {
  std::unique_ptr<std::atomic<T>[]> c(new std::atomic<T>[n]);
  for (size_t i = 0; i < n; ++i) c[i].store(init, std::memory_order_relaxed);
  return c;
}

std::atomic<int64_t> g_dropped_push_worker{-1};

std::mutex g_spans_mu;
std::vector<double> g_virtual_spans;  // bounded: a caller that never reads loses the oldest

constexpr int64_t kNever = std::numeric_limits<int64_t>::min();

void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel)) {
  }
}

}  // namespace

class Registry {
 public:
  std::shared_ptr<Session> Join(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site,
                                const std::vector<int64_t>& ordinals) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(run_id, site);
    auto it = sessions_.find(key);
    if (it != sessions_.end()) return it->second;
    // Programs run one at a time, so a failed session of an older run has no
    // live participant left: drop it now rather than leak it.
    for (auto s = sessions_.begin(); s != sessions_.end();) {
      if (s->first.first != run_id && s->second->poisoned())
        s = sessions_.erase(s);
      else
        ++s;
    }
    const int64_t step = ++steps_[std::make_pair(plan->key, site)];
    auto session = std::make_shared<Session>(std::move(plan), run_id, site, step, ordinals);
    sessions_.emplace(key, session);
    return session;
  }
  void Remove(int64_t run_id, int64_t site) {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.erase(std::make_pair(run_id, site));
  }
  int64_t Live() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(sessions_.size());
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<Session>> sessions_;
  std::map<std::pair<int64_t, int64_t>, int64_t> steps_;
};

static Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

std::string Who::Describe() const {
  return std::string(tier == kWorker ? "worker " : "proxy ") + std::to_string(index) +
         " (tier=" + std::to_string(static_cast<int>(tier)) + ", data=" + std::to_string(index) +
         ")";
}

Session::Session(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site, int64_t step,
                 std::vector<int64_t> ordinals)
    : plan_(std::move(plan)),
      run_id_(run_id),
      site_(site),
      step_(step),
      ordinals_(std::move(ordinals)) {
  const int64_t p = plan_->workers, S = plan_->num_pieces();
  storage_ = TheStoragePool().Take(*plan_, ordinals_);
  first_call_ = Counters<int32_t>(2 * p, 0);
  arrived_ = Counters<int32_t>(p * S, 0);
  proxy_progress_ = Counters<int32_t>(p * S * 2, -1);
  worker_progress_ = Counters<int32_t>(p * 2, -1);
  leading_ready_ = Counters<int32_t>(p, 0);
  mailboxes_.reset(new Mailbox[2 * p]);
  if (plan_->emulated) {
    emulator_ = std::make_unique<Emulator>(plan_->topology);
    const int64_t G = RingSteps(p) + 1;
    if (plan_->topology.virtual_clock) clock_ = Counters<int64_t>(2 * p, 0);
    push_ready_ = Counters<int64_t>(p * S, kNever);
    leading_ready_at_ = Counters<int64_t>(p, kNever);
    proxy_steps_ = Counters<int64_t>(p * S * 2 * G, kNever);
    worker_steps_ = Counters<int64_t>(p * 2 * G, kNever);
  }
}

Clock::time_point Session::Now(int64_t device) const {
  return clock_ ? AtTicks(clock_[device].load(std::memory_order_acquire)) : Clock::now();
}

void Session::AdvanceTo(int64_t device, Clock::time_point t) {
  if (clock_)
    AtomicMax(clock_[device], Ticks(t));
  else
    SleepUntil(t);
}

Clock::time_point Session::Reserve(int64_t src, int64_t dst, double bytes,
                                   Clock::time_point ready) {
  return emulator_ ? emulator_->Reserve(src, dst, bytes, ready) : ready;
}

ffi::ErrorOr<Clock::time_point> Session::ReserveInOrder(const Who& who, int64_t src, int64_t dst,
                                                        double bytes, Clock::time_point ready,
                                                        int64_t src_rank, int64_t dst_rank,
                                                        const std::string& what) {
  if (!emulator_) return ready;
  const auto deadline = std::chrono::steady_clock::now() + WaitLimit(Waits::kPeer);
  auto arrival = emulator_->ReserveInOrder(src, dst, bytes, ready, src_rank, dst_rank, [&] {
    return poisoned() || std::chrono::steady_clock::now() > deadline;
  });
  if (arrival.has_value()) return *arrival;
  if (poisoned()) return ffi::Unexpected(GaveUp(who, "booking the emulated link for " + what));
  std::string msg = "coarse_jax: " + who.Describe() + " timed out at step " +
                    std::to_string(step_) + " booking the emulated link for " + what +
                    ": the transfers ordered before it on the same ports never booked. Every "
                    "device of the mesh must run the same coarse.sync step.";
  Poison(msg);
  return ffi::Unexpected(ffi::Error(ffi::ErrorCode::kDeadlineExceeded, msg));
}

void Session::NotePushReady(int64_t worker, int64_t piece) {
  if (push_ready_)
    push_ready_[worker * plan_->num_pieces() + piece].store(Ticks(Now(worker)),
                                                            std::memory_order_release);
}

Clock::time_point Session::PushReady(int64_t worker, int64_t piece) const {
  if (!push_ready_) return Clock::time_point::min();
  return AtTicks(push_ready_[worker * plan_->num_pieces() + piece].load(std::memory_order_acquire));
}

std::atomic<int64_t>* Session::proxy_step_times(int64_t proxy, int64_t piece, int ring) const {
  if (!proxy_steps_) return nullptr;
  const int64_t G = RingSteps(p()) + 1;
  return &proxy_steps_[((proxy * plan_->num_pieces() + piece) * 2 + ring) * G];
}

std::atomic<int64_t>* Session::worker_step_times(int64_t worker, int ring) const {
  if (!worker_steps_) return nullptr;
  return &worker_steps_[(worker * 2 + ring) * (RingSteps(p()) + 1)];
}

Clock::time_point Session::ReducedAt(int64_t proxy, int64_t piece) const {
  if (!proxy_steps_) return Clock::time_point::min();
  const int32_t last = RingSteps(p());
  return AtTicks(std::max(proxy_step_times(proxy, piece, 0)[last].load(std::memory_order_acquire),
                          proxy_step_times(proxy, piece, 1)[last].load(std::memory_order_acquire)));
}

void Session::NoteLeadingReady(int64_t worker) {
  if (leading_ready_at_)
    leading_ready_at_[worker].store(Ticks(Now(worker)), std::memory_order_release);
}

Clock::time_point Session::LeadingReadyAt(int64_t worker) const {
  if (!leading_ready_at_) return Clock::time_point::min();
  return AtTicks(leading_ready_at_[worker].load(std::memory_order_acquire));
}

bool Session::IsReduced(int64_t proxy, int64_t piece) {
  const int32_t steps = static_cast<int32_t>(2 * (p() - 1));  // RingSteps (ring.h)
  return proxy_progress(proxy, piece, 0).load(std::memory_order_acquire) == steps &&
         proxy_progress(proxy, piece, 1).load(std::memory_order_acquire) == steps;
}

void Session::MarkReduced(int64_t proxy, int64_t piece) {
  const int32_t steps = static_cast<int32_t>(2 * (p() - 1));
  if (proxy_steps_) {
    const int64_t now = Ticks(Now(p() + proxy));
    for (int r = 0; r < 2; ++r)
      proxy_step_times(proxy, piece, r)[steps].store(now, std::memory_order_release);
  }
  proxy_progress(proxy, piece, 0).store(steps, std::memory_order_release);
  proxy_progress(proxy, piece, 1).store(steps, std::memory_order_release);
  for (int64_t d = 0; d < 2 * p(); ++d) Notify(d);  // its clients and the other proxies
}

Session::~Session() {
  // After a failure a device may have stopped halfway, with work of this
  // session still queued (on a GPU): its storage is freed (cudaFree waits for
  // that work), not handed to the next step.
  if (poisoned()) return;
  TheStoragePool().Give(*plan_, ordinals_, std::move(storage_));
}

bool Session::TakeFirstCall(int64_t device) {
  return first_call_[device].exchange(1, std::memory_order_acq_rel) == 0;
}

void Session::Notify(int64_t device) {
  Mailbox& m = mailboxes_[device];
  {
    std::lock_guard<std::mutex> lock(m.mu);
  }  // pairs with the waiter's check
  m.cv.notify_all();
}

void Session::Poison(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_.empty()) error_ = error;
  }
  poisoned_.store(true, std::memory_order_release);
  for (int64_t d = 0; d < 2 * p(); ++d) Notify(d);
}

std::chrono::milliseconds Session::WaitLimit(Waits kind) const {
  const int64_t grace_ms = kind == Waits::kPeer ? std::max<int64_t>(500, plan_->timeout_ms / 4) : 0;
  return std::chrono::milliseconds(plan_->timeout_ms + grace_ms);
}

ffi::Error Session::GaveUp(const Who& who, const std::string& doing) {
  std::lock_guard<std::mutex> elock(error_mu_);
  return ffi::Error::Internal("coarse_jax: " + who.Describe() + " gave up at step " +
                              std::to_string(step_) + " while " + doing +
                              ", because another device failed first: " + error_);
}

ffi::Error Session::Wait(const Who& who, Waits kind, const std::function<bool()>& ready,
                         const std::function<std::string()>& what) {
  if (ready()) return ffi::Error::Success();
  Mailbox& m = mailboxes_[who.device(p())];
  const auto timeout = WaitLimit(kind);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(m.mu);
  while (true) {
    if (ready()) return ffi::Error::Success();
    if (poisoned()) return GaveUp(who, "waiting for " + what());
    if (m.cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready() && !poisoned()) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.3f", timeout.count() / 1000.0);
      std::string msg = "coarse_jax: " + who.Describe() + " timed out after " + secs +
                        " s at step " + std::to_string(step_) + " waiting for " + what() +
                        ". Every device of the mesh must run the same coarse.sync step; "
                        "raise Config(timeout_s=...) if the step is just slow.";
      lock.unlock();
      Poison(msg);
      return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, msg);
    }
  }
}

void Session::Leave() {
  if (left_.fetch_add(1, std::memory_order_acq_rel) + 1 != 2 * p()) return;
  if (clock_) {
    int64_t span = 0;
    for (int64_t d = 0; d < 2 * p(); ++d)
      span = std::max(span, clock_[d].load(std::memory_order_acquire));
    std::lock_guard<std::mutex> lock(g_spans_mu);
    if (g_virtual_spans.size() >= 4096) g_virtual_spans.erase(g_virtual_spans.begin());
    g_virtual_spans.push_back(std::chrono::duration<double>(Clock::duration(span)).count());
  }
  TheRegistry().Remove(run_id_, site_);
}

std::shared_ptr<Session> JoinSession(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site,
                                     const std::vector<int64_t>& ordinals) {
  return TheRegistry().Join(std::move(plan), run_id, site, ordinals);
}

void InjectDroppedPush(int64_t worker) { g_dropped_push_worker.store(worker); }

bool TakeDroppedPush(int64_t worker) {
  int64_t expected = worker;
  return g_dropped_push_worker.compare_exchange_strong(expected, -1);
}

int64_t LiveSessions() { return TheRegistry().Live(); }

std::vector<double> TakeVirtualSpans() {
  std::lock_guard<std::mutex> lock(g_spans_mu);
  std::vector<double> out;
  out.swap(g_virtual_spans);
  return out;
}

}  // namespace coarse
