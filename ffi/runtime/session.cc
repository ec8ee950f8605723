// Session and its registry (see session.h): storage, counters, mailboxes,
// waits with deadlines, the emulated clocks, and the testing hooks.
#include "runtime/session.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <numeric>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "runtime/faults.h"
#include "runtime/interrupt.h"

namespace coarse {

namespace {

template <typename T>
std::unique_ptr<std::atomic<T>[]> Counters(size_t n, T init) {
  std::unique_ptr<std::atomic<T>[]> c(new std::atomic<T>[n]);
  for (size_t i = 0; i < n; ++i) c[i].store(init, std::memory_order_relaxed);
  return c;
}

std::atomic<int64_t> g_dropped_push_worker{-1};
std::atomic<bool> g_stale_flags{false};

std::mutex g_spans_mu;
std::vector<double> g_virtual_spans;  // bounded: a caller that never reads loses the oldest

constexpr int64_t kNever = std::numeric_limits<int64_t>::min();

void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel)) {
  }
}

}  // namespace

// The sessions of the runs in flight, plus two kinds of counters:
//
// * iterations: per (run, site, device), how many sessions of (run, site) the
//   device has finished; its next call of the site joins that iteration (see
//   session.h). Kept for the kMaxRunsRemembered most recent runs (in the order
//   they opened their first session); older ones are forgotten. That is safe
//   because a run's counters are only read while the run executes, and few
//   runs execute at once: on CPU, multi-device programs are gang-scheduled one
//   at a time, so only the newest run is live; on a GPU, async dispatch keeps
//   a handful of executions in flight, far fewer than kMaxRunsRemembered.
//   With each run the interrupt count when it opened its first session
//   (Ctrl-C, interrupt.h) is kept too.
// * steps: per (plan, site), sessions created so far, the "step N" of error
//   messages. At most kMaxStepCounters pairs, least recently used forgotten
//   first (a forgotten pair's numbering restarts at 1: messages only).
class Registry {
 public:
  std::shared_ptr<Session> Join(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site,
                                int64_t device, const int64_t* ordinals, size_t num_ordinals) {
    std::lock_guard<std::mutex> lock(mu_);
    RunState& run = RunLocked(run_id);
    const int64_t iteration = run.iterations[std::make_pair(site, device)];
    const Key key{run_id, site, iteration};
    auto it = sessions_.find(key);
    if (it != sessions_.end()) return it->second;
    // Programs run one at a time on CPU, so a failed session of an older run
    // whose devices did not all finish (Session::Finish; e.g. one never got
    // to its calls) has no live participant left: drop it now rather than
    // leak it.
    for (auto s = sessions_.begin(); s != sessions_.end();) {
      if (std::get<0>(s->first) != run_id && s->second->poisoned())
        s = sessions_.erase(s);
      else
        ++s;
    }
    const int64_t step = NextStepLocked(plan->key, site);
    auto session = std::make_shared<Session>(
        std::move(plan), run_id, site, iteration, step, run.interrupts_at_start,
        std::vector<int64_t>(ordinals, ordinals + num_ordinals));
    sessions_.emplace(key, session);
    return session;
  }

  // `device` finished its session `iteration` of (run, site): its next call
  // of the site belongs to the next iteration.
  void Advance(int64_t run_id, int64_t site, int64_t iteration, int64_t device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto run = runs_.find(run_id);
    if (run == runs_.end()) return;  // forgotten: the run is long over
    int64_t& next = run->second.iterations[std::make_pair(site, device)];
    next = std::max(next, iteration + 1);
  }

  void Remove(int64_t run_id, int64_t site, int64_t iteration, const Session* session) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(Key{run_id, site, iteration});
    if (it != sessions_.end() && it->second.get() == session) sessions_.erase(it);
  }

  std::vector<std::shared_ptr<Session>> OfRun(int64_t run_id) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<Session>> out;
    for (const auto& [key, session] : sessions_)
      if (std::get<0>(key) == run_id) out.push_back(session);
    return out;
  }

  RegistryStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return RegistryStats{static_cast<int64_t>(sessions_.size()), static_cast<int64_t>(runs_.size()),
                         static_cast<int64_t>(steps_.size())};
  }

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t>;  // run, site, iteration
  struct RunState {
    std::map<std::pair<int64_t, int64_t>, int64_t> iterations;  // (site, device) -> next
    int64_t interrupts_at_start = 0;
  };
  struct StepCounter {
    int64_t count = 0;
    std::list<std::pair<int64_t, int64_t>>::iterator lru;
  };

  RunState& RunLocked(int64_t run_id) {
    auto it = runs_.find(run_id);
    if (it != runs_.end()) return it->second;
    // A new run: make sure a Ctrl-C during it reaches the waits (Python may
    // have replaced the SIGINT hook since the last run).
    ArmInterruptHook();
    run_order_.push_back(run_id);
    while (static_cast<int64_t>(run_order_.size()) > kMaxRunsRemembered) {
      runs_.erase(run_order_.front());
      run_order_.pop_front();
    }
    RunState& run = runs_[run_id];
    run.interrupts_at_start = InterruptCount();
    return run;
  }

  int64_t NextStepLocked(int64_t plan_key, int64_t site) {
    const auto key = std::make_pair(plan_key, site);
    auto it = steps_.find(key);
    if (it == steps_.end()) {
      if (static_cast<int64_t>(steps_.size()) >= kMaxStepCounters) {
        steps_.erase(steps_lru_.back());
        steps_lru_.pop_back();
      }
      steps_lru_.push_front(key);
      it = steps_.emplace(key, StepCounter{0, steps_lru_.begin()}).first;
    } else {
      steps_lru_.splice(steps_lru_.begin(), steps_lru_, it->second.lru);
    }
    return ++it->second.count;
  }

  std::mutex mu_;
  std::map<Key, std::shared_ptr<Session>> sessions_;
  std::unordered_map<int64_t, RunState> runs_;
  std::deque<int64_t> run_order_;  // oldest first
  std::map<std::pair<int64_t, int64_t>, StepCounter> steps_;
  std::list<std::pair<int64_t, int64_t>> steps_lru_;  // most recently used first
};

static Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

Session::Session(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site, int64_t iteration,
                 int64_t step, int64_t interrupts_at_start, std::vector<int64_t> ordinals)
    : plan_(std::move(plan)),
      run_id_(run_id),
      site_(site),
      iteration_(iteration),
      step_(step),
      interrupts_at_start_(interrupts_at_start),
      ordinals_(std::move(ordinals)) {
  const int64_t p = plan_->workers, q = plan_->proxies, D = plan_->devices(),
                S = plan_->num_pieces();
  dropped_push_worker_.store(g_dropped_push_worker.exchange(-1), std::memory_order_relaxed);
  storage_ = TheStoragePool().Take(*plan_, ordinals_);
  const bool stale = g_stale_flags.exchange(false);  // testing: InjectStaleFlags
  ready_value_ = storage_ ? (stale ? storage_->SameUse() : storage_->NextUse()) : 0;
  first_call_ = Counters<int32_t>(D, 0);
  finished_ = Counters<int32_t>(D, 0);
  arrived_ = Counters<int32_t>(q * S, 0);
  pushed_ = Counters<uint8_t>(p * S, 0);
  proxy_progress_ = Counters<int32_t>(q * S * 2, -1);
  worker_progress_ = Counters<int32_t>(p * 2, -1);
  pushed_runs_.reset(new PushedRuns[p * S]);
  leading_runs_.reset(new PushedRuns[p]);
  pushes_of_ = Counters<int32_t>(S, 0);
  mailboxes_.reset(new Mailbox[D]);
  norm_parts_.reset(new double[q]());
  update_posted_ = Counters<int32_t>(q, 0);
  update_scalars_.reset(new float[3 * q]());
  update_steps_.assign(q, nullptr);
  host_chunks_.reset(new HostVector<float>[q]);
  host_stage_ = Counters<int32_t>(q, 0);
  if (plan_->emulated) {
    emulator_ = std::make_unique<Emulator>(plan_->topology);
    if (plan_->topology.virtual_clock) clock_ = Counters<int64_t>(D, 0);
    push_ready_ = Counters<int64_t>(p * S, kNever);
    proxy_steps_ = Counters<int64_t>(q * S * 2 * (RingSteps(q) + 1), kNever);
    worker_steps_ = Counters<int64_t>(p * 2 * (RingSteps(p) + 1), kNever);
  }
  if (storage_ && !emulator_) shared_memory_ = storage_->shared_memory();
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

StatusOr<Clock::time_point> Session::ReserveInOrder(const Who& who, int64_t src, int64_t dst,
                                                    double bytes, Clock::time_point ready,
                                                    int64_t src_rank, int64_t dst_rank,
                                                    const std::string& what) {
  if (!emulator_) return ready;
  const auto deadline = std::chrono::steady_clock::now() + WaitLimit(Waits::kPeer);
  auto arrival = emulator_->ReserveInOrder(src, dst, bytes, ready, src_rank, dst_rank, [&] {
    return poisoned() || Interrupted() || std::chrono::steady_clock::now() > deadline;
  });
  if (arrival.has_value()) return *arrival;
  if (poisoned()) return GaveUp(who, "booking the emulated link for " + what);
  if (Interrupted()) return StopInterrupted(who, "booking the emulated link for " + what);
  std::string msg = "coarse_jax: " + who.Describe() + " timed out" + DescribeStep() +
                    " booking the emulated link for " + what +
                    ": the transfers ordered before it on the same ports never booked. Every "
                    "device of the mesh must run the same coarse.sync step.";
  Poison(msg);
  return Status(StatusCode::kDeadlineExceeded, msg);
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
  const int64_t G = RingSteps(q()) + 1;
  return &proxy_steps_[((proxy * plan_->num_pieces() + piece) * 2 + ring) * G];
}

std::atomic<int64_t>* Session::worker_step_times(int64_t worker, int ring) const {
  if (!worker_steps_) return nullptr;
  return &worker_steps_[(worker * 2 + ring) * (RingSteps(p()) + 1)];
}

Clock::time_point Session::ReducedAt(int64_t proxy, int64_t piece) const {
  if (!proxy_steps_) return Clock::time_point::min();
  const int32_t last = RingSteps(q());
  return AtTicks(std::max(proxy_step_times(proxy, piece, 0)[last].load(std::memory_order_acquire),
                          proxy_step_times(proxy, piece, 1)[last].load(std::memory_order_acquire)));
}

bool Session::IsReduced(int64_t proxy, int64_t piece) {
  const int32_t steps = RingSteps(q());
  return proxy_progress(proxy, piece, 0).load(std::memory_order_acquire) == steps &&
         proxy_progress(proxy, piece, 1).load(std::memory_order_acquire) == steps;
}

void Session::MarkReduced(int64_t proxy, int64_t piece) {
  const int32_t steps = RingSteps(q());
  if (proxy_steps_) {
    const int64_t now = Ticks(Now(p() + proxy));
    for (int r = 0; r < 2; ++r)
      proxy_step_times(proxy, piece, r)[steps].store(now, std::memory_order_release);
  }
  proxy_progress(proxy, piece, 0).store(steps, std::memory_order_release);
  proxy_progress(proxy, piece, 1).store(steps, std::memory_order_release);
  for (int64_t d = 0; d < devices(); ++d)  // the other proxies; the pulls: PullWakeups
    if ((d >= p() && d != p() + proxy) || NotifiesPerPiece()) Notify(d);
}

Session::~Session() {
  if (store_) store_->Close(this, false);  // a session that never finished commits nothing
  // After a failure a device may have stopped halfway, with work of this
  // session still queued (on a GPU): its storage is freed (cudaFree waits for
  // that work), not handed to the next step.
  if (poisoned()) return;
  TheStoragePool().Give(*plan_, ordinals_, std::move(storage_));
}

bool Session::TakeFirstCall(int64_t device) {
  return first_call_[device].exchange(1, std::memory_order_acq_rel) == 0;
}

void Session::Notify(int64_t device) { mailboxes_[device].Notify(); }

void Session::Poison(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_.empty()) error_ = error;
  }
  poisoned_.store(true, std::memory_order_release);
  for (int64_t d = 0; d < devices(); ++d) Notify(d);
}

// The longest wait a Config can ask for: about 31 years. A steady_clock time
// point counts int64 nanoseconds, so now + timeout_s overflows (and fires at
// once) from timeout_s ~ 9.2e9 s minus the host's uptime; anything longer
// than this is "forever" anyway.
constexpr int64_t kMaxWaitMs = int64_t{1000} << 30;

std::chrono::milliseconds Session::WaitLimit(Waits kind) const {
  const int64_t timeout_ms = std::clamp<int64_t>(plan_->timeout_ms, 0, kMaxWaitMs);
  const int64_t grace_ms = kind == Waits::kPeer ? std::max<int64_t>(500, timeout_ms / 4) : 0;
  return std::chrono::milliseconds(timeout_ms + grace_ms);
}

std::string Session::DescribeStep() const {
  std::string out = " at step " + std::to_string(step_);
  if (iteration_ > 0) out += " (loop iteration " + std::to_string(iteration_) + ")";
  return out;
}

Status Session::GaveUp(const Who& who, const std::string& doing) {
  std::lock_guard<std::mutex> elock(error_mu_);
  return Status::Internal("coarse_jax: " + who.Describe() + " gave up" + DescribeStep() +
                          " while " + doing + ", because another device failed first: " + error_);
}

bool Session::Interrupted() const {
  return InterruptAborts() && (InterruptCount() != interrupts_at_start_ || ExitingAfterInterrupt());
}

Status Session::StopInterrupted(const Who& who, const std::string& doing) {
  const std::string msg = "coarse_jax: " + who.Describe() + " stopped" + DescribeStep() +
                          " while " + doing +
                          ": interrupted (Ctrl-C / SIGINT); the step was abandoned on every "
                          "device of the mesh.";
  Poison(msg);
  return Status(StatusCode::kCancelled, msg);
}

Status Session::Wait(const Who& who, Waits kind, FunctionRef<bool()> ready,
                     FunctionRef<std::string()> what) {
  if (ready()) return Status::Success();
  Mailbox& m = mailboxes_[who.device(p())];
  const auto timeout = WaitLimit(kind);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto woken = [&] { return ready() || poisoned(); };
  bool interrupt_seen = false;
  while (true) {
    if (ready()) return Status::Success();
    if (poisoned()) return GaveUp(who, "waiting for " + what());
    if (Interrupted()) {
      // A wait on a peer stops one slice later than a wait on a push, so
      // that the error names the root of a stall (the missing push), as
      // with timeouts (Waits).
      if (kind == Waits::kPush || interrupt_seen)
        return StopInterrupted(who, "waiting for " + what());
      interrupt_seen = true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.3f", timeout.count() / 1000.0);
      std::string msg = "coarse_jax: " + who.Describe() + " timed out after " + secs + " s" +
                        DescribeStep() + " waiting for " + what() +
                        ". Every device of the mesh must run the same coarse.sync step; "
                        "raise Config(timeout_s=...) if the step is just slow.";
      Poison(msg);
      return Status(StatusCode::kDeadlineExceeded, msg);
    }
    // Short slices, so that a Ctrl-C is noticed (interrupt.h); a peer's
    // progress still wakes the wait at once (Notify).
    m.Await(woken, std::min(deadline, now + kInterruptPoll));
  }
}

bool Session::ProxiesFinished() const {
  return proxies_left_.load(std::memory_order_acquire) == q();
}

void Session::AwaitProxiesLeft(const Who& worker) {
  const auto deadline = std::chrono::steady_clock::now() + WaitLimit(Waits::kPeer);
  // A proxy's Finish notifies every worker.
  mailboxes_[worker.device(p())].Await([&] { return ProxiesFinished(); }, deadline);
}

void Session::Finish(int64_t device) {
  if (finished_[device].exchange(1, std::memory_order_acq_rel) != 0) return;
  TheRegistry().Advance(run_id_, site_, iteration_, device);
  if (left_.fetch_add(1, std::memory_order_acq_rel) + 1 == devices()) End();
  if (device >= p()) {
    // Counted only now, after this proxy's left_: a worker waiting for the
    // proxies (FinishCall) is then the one whose Finish ends the session.
    proxies_left_.fetch_add(1, std::memory_order_acq_rel);
    for (int64_t w = 0; w < p(); ++w) Notify(w);
  }
}

void Session::End() {
  // The host's synchronization is done: an inter-host step starts from here.
  if (emulator_ && !clock_ && !poisoned()) NoteSyncEnd(run_id_, site_, Clock::now());
  if (clock_ && !poisoned()) {
    int64_t span = 0;
    for (int64_t d = 0; d < devices(); ++d)
      span = std::max(span, clock_[d].load(std::memory_order_acquire));
    std::lock_guard<std::mutex> lock(g_spans_mu);
    if (g_virtual_spans.size() >= 4096) g_virtual_spans.erase(g_virtual_spans.begin());
    g_virtual_spans.push_back(std::chrono::duration<double>(Clock::duration(span)).count());
  }
  std::shared_ptr<SessionHold> store;
  {
    std::lock_guard<std::mutex> lock(store_mu_);
    store = store_;
  }
  if (store) store->Close(this, !poisoned());
  TheRegistry().Remove(run_id_, site_, iteration_, this);
}

void Session::set_store(std::shared_ptr<SessionHold> store) {
  std::lock_guard<std::mutex> lock(store_mu_);
  store_ = std::move(store);
}

void Session::PostNormPart(int64_t proxy, double sum_sq) {
  norm_parts_[proxy] = sum_sq;
  norm_posted_.fetch_add(1, std::memory_order_acq_rel);
  for (int64_t k = 0; k < q(); ++k) Notify(p() + k);
}

void Session::PostUpdateInputs(int64_t proxy, const float scalars[3], const float* step) {
  for (int i = 0; i < 3; ++i) update_scalars_[3 * proxy + i] = scalars[i];
  update_steps_[proxy] = step;
  update_posted_[proxy].store(1, std::memory_order_release);
  Notify(p() + proxy);
}

void Session::PostHostChunks(int64_t proxy, int32_t stage) {
  host_stage_[proxy].store(stage, std::memory_order_release);
  // Stage 1 wakes proxy k's group leader (Plan::group_leader), stage 2 proxy k.
  Notify(stage == 1 ? plan_->group_leader(proxy) : p() + proxy);
}

bool Session::NormReady() const { return norm_posted_.load(std::memory_order_acquire) == q(); }

double Session::NormTotal() const {  // in proxy order, from 0 (the bits: ClipScalarsOf's)
  return std::accumulate(norm_parts_.get(), norm_parts_.get() + q(), 0.0);
}

bool Session::TakeDroppedPush(int64_t worker) {
  int64_t expected = worker;
  return dropped_push_worker_.compare_exchange_strong(expected, -1);
}

std::shared_ptr<Session> JoinSession(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site,
                                     int64_t device, const int64_t* ordinals, size_t num_ordinals) {
  return TheRegistry().Join(std::move(plan), run_id, site, device, ordinals, num_ordinals);
}

void InjectDroppedPush(int64_t worker) { g_dropped_push_worker.store(worker); }
void InjectStaleFlags() { g_stale_flags.store(true); }

int64_t LiveSessions() { return TheRegistry().Stats().live_sessions; }

std::vector<std::shared_ptr<Session>> SessionsOfRun(int64_t run_id) {
  return TheRegistry().OfRun(run_id);
}

RegistryStats TheRegistryStats() { return TheRegistry().Stats(); }

std::vector<double> TakeVirtualSpans() {
  std::lock_guard<std::mutex> lock(g_spans_mu);
  std::vector<double> out;
  out.swap(g_virtual_spans);
  return out;
}

}  // namespace coarse
