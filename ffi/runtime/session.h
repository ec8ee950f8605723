// The runtime's shared state for one synchronization in one execution.
//
// A Session is keyed by (FFI RunId, call site, iteration): every custom call
// of one synchronization of a `coarse.sync` step on every device of the mesh
// finds the same Session. The iteration tells apart the repetitions of one
// call site inside one execution, when the synchronization sits in a
// `lax.fori_loop` / `lax.scan` body (gradient accumulation over
// micro-batches): each device counts its own sessions of (run, site), and its
// k-th is iteration k. That is sound because every device runs every call of
// every iteration, in order (a loop body runs to completion before the next
// iteration starts), and a device's part of a session ends with its call
// carrying attribute last=1 (FinishCall(last=true)), which moves the device to
// the next iteration. It
// owns the proxies' f32 storage (per-client slots, see Plan), the workers'
// f32 scratch for the leading layers, and the progress counters that order
// the rings. Custom calls of one program on different devices run on
// different threads, so they meet here; a call never waits for another
// program, and every wait has a deadline.
//
// Devices are numbered worker i -> i, proxy k -> p + k (k < q, Plan::proxies). Each device has a
// mailbox (mailbox.h: a wait spins briefly, then parks on a condition
// variable); whoever advances state a device may be waiting for pokes that
// device's mailbox, so no wait polls and no wake-up is broadcast to everyone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/emulator.h"
#include "runtime/function_ref.h"
#include "runtime/host_memory.h"
#include "runtime/mailbox.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "runtime/storage.h"

namespace coarse {

class Session;

// What a session holds until it ends (ParamStore, runtime/param_store.h,
// implements it): the session's end closes the hold, committing only when
// every device finished without error. An interface here, so the session
// needs nothing of the store above it.
class SessionHold {
 public:
  virtual ~SessionHold() = default;
  virtual void Close(const Session* session, bool ok) = 0;
};

enum Tier : int32_t { kWorker = 0, kProxy = 1 };

// Who is calling: its tier and position on the "data" axis (the handlers read
// it from the (tier, data) index operand, or from the device ordinal on CUDA).
struct Who {
  Tier tier;
  int64_t index;  // a worker's position on the "data" axis; a proxy's number, 0..q-1
  // A proxy's group size k (COARSE k:1): the mesh repeats proxy j on "data"
  // positions j*k .. j*k + k - 1, next to its workers (coarse_jax/mesh.py).
  int64_t group = 1;
  // A proxy in host memory (IsHostOrdinal): it has no mesh coordinates.
  bool on_host = false;
  int64_t device(int64_t p) const { return tier == kWorker ? index : p + index; }
  std::string Describe() const;
};

class Session {
 public:
  Session(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site, int64_t iteration,
          int64_t step, int64_t interrupts_at_start, std::vector<int64_t> ordinals);
  ~Session();

  const Plan& plan() const { return *plan_; }
  const std::shared_ptr<const Plan>& shared_plan() const { return plan_; }
  const std::vector<int64_t>& ordinals() const { return ordinals_; }
  int64_t step() const { return step_; }
  int64_t iteration() const { return iteration_; }
  int64_t site() const { return site_; }
  // " at step 3" or " at step 3 (loop iteration 2)": how errors name the session.
  std::string DescribeStep() const;
  int64_t p() const { return plan_->workers; }
  int64_t q() const { return plan_->proxies; }
  int64_t devices() const { return plan_->devices(); }
  // How the runtime names proxy k (Who::Describe).
  Who proxy(int64_t k) const {
    const bool on_host = !ordinals_.empty() && IsHostOrdinal(ordinals_[plan_->workers + k]);
    return Who{kProxy, k, plan_->group_size(), on_host};
  }

  // Storage (from this module's pool; see storage.h).
  float* arena(int64_t proxy) { return storage_->arena(proxy); }
  float* scratch(int64_t worker) { return storage_->scratch(worker); }
  Storage& storage() { return *storage_; }
  // Proxy `proxy`'s ready flag of `piece`, or null (Storage::ready_flags),
  // and the value that says "final in this session".
  uint32_t* ready_flag(int64_t proxy, int64_t piece) {
    uint32_t* flags = storage_->ready_flags(proxy);
    return flags ? flags + piece : nullptr;
  }
  uint32_t ready_value() const { return ready_value_; }
  // How long a wait on a peer may last (Wait's limit for Waits::kPeer): for
  // the waits that are not on the host's counters (Stream::HostWait, WaitValue).
  std::chrono::milliseconds PeerWaitLimit() const { return WaitLimit(Waits::kPeer); }

  // True exactly once per mesh device: its first call of this session, which
  // must first wait (Device::Acquire) for every device's work of the session
  // that used this storage before.
  bool TakeFirstCall(int64_t device);

  // Counters (all start at 0 / -1 for ring progress = "not ready").
  std::atomic<int32_t>& arrived(int64_t proxy, int64_t piece) {
    return arrived_[proxy * plan_->num_pieces() + piece];
  }
  // Whether `worker` has pushed `piece` (to whichever proxy it is routed):
  // set before the push bumps arrived(), so a timed-out wait names exactly
  // the workers whose push is missing, not the proxy's whole group.
  std::atomic<uint8_t>& pushed(int64_t worker, int64_t piece) {
    return pushed_[worker * plan_->num_pieces() + piece];
  }
  // What worker `worker` pushed of `piece` when the proxies read pushes in
  // place (PushesInPlace, phases.h): written before the push bumps
  // arrived(), read after it.
  PushedRuns& pushed_runs(int64_t worker, int64_t piece) {
    return pushed_runs_[worker * plan_->num_pieces() + piece];
  }
  // How many workers have pushed `piece` (in-place pushes only): the push
  // that completes it wakes the proxies, which all wait for every push.
  std::atomic<int32_t>& pushes_of(int64_t piece) { return pushes_of_[piece]; }
  std::atomic<int32_t>& proxy_progress(int64_t proxy, int64_t piece, int ring) {
    return proxy_progress_[(proxy * plan_->num_pieces() + piece) * 2 + ring];
  }
  std::atomic<int32_t>& worker_progress(int64_t worker, int ring) {
    return worker_progress_[worker * 2 + ring];
  }
  // A worker's leading leaves when the workers reduce them in one pass
  // (OneShotLeading, phases.h): written before its worker_progress(w, 0)
  // reaches 0, read after.
  PushedRuns& leading_runs(int64_t worker) { return leading_runs_[worker]; }

  // Piece `piece` is reduced on proxy `proxy`: both its rings are complete
  // there (or it was marked so without a ring, see MarkReduced).
  bool IsReduced(int64_t proxy, int64_t piece);
  // Marks it reduced without a ring (DENSE) and wakes the other proxies (the
  // pulls are woken by the proxy: PullWakeups, phases/pull_wakeups.h).
  void MarkReduced(int64_t proxy, int64_t piece);

  // Emulated transport (see emulator.h). Times are Clock time points: the
  // host's steady clock, or with a virtual clock simulated time since the
  // session opened. Without a topology nothing is booked and nothing waits.
  bool emulated() const { return emulator_ != nullptr; }
  // The shared-memory strategy (runtime/shared_memory.h), chosen once when
  // the session is created: its storage's, unless links are emulated (the
  // emulated schedule is the paper's, with every copy timed); null where
  // the protocol copies (phases.h: GatherPull).
  SharedMemory* shared_memory() const { return shared_memory_; }
  // Device `device`'s current time.
  Clock::time_point Now(int64_t device) const;
  // Device `device` waits until `t`: sleeps (real clock) or moves its
  // simulated clock forward (virtual clock). Never moves a clock back.
  void AdvanceTo(int64_t device, Clock::time_point t);
  // Books a transfer of `bytes` from device `src` to `dst` whose data is
  // ready at `ready`; returns its arrival (`ready` without a topology).
  Clock::time_point Reserve(int64_t src, int64_t dst, double bytes, Clock::time_point ready);
  // Reserve for a worker<->proxy transfer in the plan's port order
  // (Emulator::ReserveInOrder, ranks from Plan). `who` (the caller) and
  // `what` name the wait in the error if earlier transfers never book.
  StatusOr<Clock::time_point> ReserveInOrder(const Who& who, int64_t src, int64_t dst, double bytes,
                                             Clock::time_point ready, int64_t src_rank,
                                             int64_t dst_rank, const std::string& what);

  // When shared state changed, for whoever books a transfer from it (all
  // Clock::time_point::min() without a topology). A waiter's transfer is
  // ready at max(its own Now(), the event's time).
  // Worker `worker` published its push of `piece` (at its Now()).
  void NotePushReady(int64_t worker, int64_t piece);
  Clock::time_point PushReady(int64_t worker, int64_t piece) const;
  // Piece `piece` became reduced on proxy `proxy` (see IsReduced).
  Clock::time_point ReducedAt(int64_t proxy, int64_t piece) const;
  // Per ring member, RingSteps(p) + 1 times: when its progress reached g
  // (ring.h). Null without a topology.
  std::atomic<int64_t>* proxy_step_times(int64_t proxy, int64_t piece, int ring) const;
  std::atomic<int64_t>* worker_step_times(int64_t worker, int ring) const;

  // Wakes device `device` if it waits on anything.
  void Notify(int64_t device);

  // What a wait depends on. A wait for a worker's push is a root: nothing
  // else explains it. A wait for a peer's progress (ring step, reduced piece,
  // handed-over leading layers) usually stalls because that peer waits on a
  // root, so it gets a grace period: the root times out first and its error,
  // naming the missing push, is the one every device reports.
  enum class Waits { kPush, kPeer };

  // Waits until `ready()` holds. On timeout the session is poisoned (so peers
  // stop waiting for this device at once) and the error names the device,
  // tier, step and what it waited for (`what()` is only built on error).
  // The wait sleeps in slices of kInterruptPoll (interrupt.h): a SIGINT
  // (Ctrl-C) since the run started poisons the session the same way, with
  // an error saying it was interrupted.
  // (FunctionRef: a wait per piece builds no std::function.)
  Status Wait(const Who& who, Waits kind, FunctionRef<bool()> ready,
              FunctionRef<std::string()> what);

  // Marks the session failed with `error` and wakes everyone.
  void Poison(const std::string& error);
  // Success, or once the session is poisoned the error of `who`, which
  // stops `doing` something because another device failed first: for a
  // wait whose condition may hold even so (the proxies leave a failed
  // session too).
  Status FailureOf(const Who& who, const std::string& doing) {
    return poisoned() ? GaveUp(who, doing) : Status::Success();
  }
  bool poisoned() const { return poisoned_.load(std::memory_order_acquire); }
  int64_t run_id() const { return run_id_; }
  // Whether `device` has made a call of this session (a proxy: its job reached its
  // storage), and whether it has finished it.
  bool Started(int64_t device) const {
    return first_call_[device].load(std::memory_order_acquire) != 0;
  }
  bool Finished(int64_t device) const {
    return finished_[device].load(std::memory_order_acquire) != 0;
  }
  // Whether `device` has made a call of this session and not finished it.
  bool InProgress(int64_t device) const {
    return first_call_[device].load(std::memory_order_acquire) != 0 &&
           finished_[device].load(std::memory_order_acquire) == 0;
  }

  // Device `device` is done with this session: its call with last=1
  // returned, or one of its calls failed (XLA then runs none of its later
  // calls). Moves the device to its next iteration of (run, site); the last
  // device to be done removes the session from the registry, failed or not.
  // Idempotent per device.
  void Finish(int64_t device);

  // The proxy optimizer's store this session holds (ParamStore::Enter sets
  // it): the session's end closes the hold, committing only a session that
  // finished on every device without error.
  void set_store(std::shared_ptr<SessionHold> store);
  // Global-norm clipping: proxy k posts the f64 sum of squares of the mean
  // gradient it owns; once all p have, NormTotal() sums them in proxy order.
  // Where the shares stay on the devices (NormOnDevice) the post says the
  // share is enqueued and published, and `sum_sq` is 0.
  void PostNormPart(int64_t proxy, double sum_sq);
  bool NormReady() const;
  double NormTotal() const;

  // The proxies run as a service (runtime/service.h): true exactly once per
  // session, for the worker call that starts their jobs.
  bool TakeProxyStart() { return !proxies_started_.exchange(true, std::memory_order_acq_rel); }
  bool proxies_started() const { return proxies_started_.load(std::memory_order_acquire); }
  // Every proxy left the session (Finish). A worker's last call waits for
  // it (FinishCall, call.h): when the workers' program is done, so is the
  // session, its optimizer update committed or rolled back.
  bool ProxiesFinished() const;
  // After a failure (the session poisoned): waits, at most one peer wait
  // (WaitLimit(kPeer)), for the proxy jobs to notice and leave, so that the
  // error a worker's call returns also means the session is over. Unlike
  // Wait it ignores the poison: that is what the proxies are leaving on.
  void AwaitProxiesLeft(const Who& worker);
  // value_and_update: worker k's coarse_proxy_ring has set the store up for
  // proxy k (BeginUpdate: hold, layout, snapshot copy, seed or params check)
  // and posts this step's scalars (lr, 1 - b1^t, 1 - b2^t): `step`, where its
  // stream copied them into the proxy's memory (OptScalars::step), or, with
  // `step` null (the self-test, no XLA buffer), their values; proxy k's job
  // waits for them before its first update (AwaitUpdateInputs, phases.h).
  void PostUpdateInputs(int64_t proxy, const float scalars[3], const float* step);
  bool UpdateInputsPosted(int64_t proxy) const {
    return update_posted_[proxy].load(std::memory_order_acquire) != 0;
  }
  const float* UpdateScalars(int64_t proxy) const { return &update_scalars_[3 * proxy]; }
  const float* UpdateStep(int64_t proxy) const { return update_steps_[proxy]; }
  // Across hosts with the proxy optimizer (runtime/service.h): proxy k's
  // owned chunks after the reduce-scatter go out through worker k's stage-1
  // call and come back, summed over the hosts, through its stage-2 call.
  // The buffer is proxy k's (host memory; only proxy k resizes it, before it
  // posts stage 1); stage 1: the proxy exported them, 2: the worker put the
  // global chunks back.
  HostVector<float>& host_chunks(int64_t proxy) { return host_chunks_[proxy]; }
  void PostHostChunks(int64_t proxy, int32_t stage);
  bool HostChunksAt(int64_t proxy, int32_t stage) const {
    return host_stage_[proxy].load(std::memory_order_acquire) >= stage;
  }

  // Testing (InjectDroppedPush): whether to drop this push of `worker`; true
  // at most once per session.
  bool TakeDroppedPush(int64_t worker);

 private:
  // The last device's part of Finish: timing, the store's commit, removal.
  void End();
  // How long a wait of `kind` may last: the timeout, plus a grace period for
  // waits on peers (see Waits).
  std::chrono::milliseconds WaitLimit(Waits kind) const;
  // The error of a device that stops `doing` something because another failed.
  Status GaveUp(const Who& who, const std::string& doing);
  // A SIGINT arrived since the run's first session opened (and interrupts abort).
  bool Interrupted() const;
  // Poisons the session with the interrupt error of `who`, stopped `doing`.
  Status StopInterrupted(const Who& who, const std::string& doing);

  std::shared_ptr<const Plan> plan_;
  int64_t run_id_, site_, iteration_, step_;
  int64_t interrupts_at_start_;  // InterruptCount() when the run opened its first session
  uint32_t ready_value_ = 0;     // Storage::NextUse of this session's set
  std::vector<int64_t> ordinals_;
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<std::atomic<int32_t>[]> first_call_;
  std::unique_ptr<std::atomic<int32_t>[]> arrived_, proxy_progress_, worker_progress_;
  std::unique_ptr<std::atomic<uint8_t>[]> pushed_;     // [worker * S + piece]
  std::unique_ptr<PushedRuns[]> pushed_runs_;          // [worker * S + piece]
  std::unique_ptr<PushedRuns[]> leading_runs_;         // [worker]
  std::unique_ptr<std::atomic<int32_t>[]> pushes_of_;  // [piece]
  std::unique_ptr<Mailbox[]> mailboxes_;
  std::unique_ptr<Emulator> emulator_;  // null without a topology
  SharedMemory* shared_memory_ = nullptr;
  // Emulated sessions only; Clock::duration counts (see the accessors above).
  std::unique_ptr<std::atomic<int64_t>[]> clock_;       // [device], virtual clock only
  std::unique_ptr<std::atomic<int64_t>[]> push_ready_;  // [worker * S + piece]
  // Ring step times, RingSteps(p) + 1 per (member, ring); see *_step_times.
  std::unique_ptr<std::atomic<int64_t>[]> proxy_steps_;   // [(proxy*S + piece)*2 + ring][g]
  std::unique_ptr<std::atomic<int64_t>[]> worker_steps_;  // [worker*2 + ring][g]
  std::atomic<bool> poisoned_{false};
  std::mutex error_mu_;
  std::string error_;
  std::unique_ptr<std::atomic<int32_t>[]> finished_;  // [device]: Finish was called
  std::atomic<int64_t> left_{0};                      // devices finished
  std::atomic<int64_t> proxies_left_{0};              // proxies finished (after left_)
  std::atomic<int64_t> dropped_push_worker_{-1};      // InjectDroppedPush, taken at creation
  std::mutex store_mu_;
  std::shared_ptr<SessionHold> store_;
  std::unique_ptr<double[]> norm_parts_;  // [proxy]
  std::atomic<bool> proxies_started_{false};
  std::unique_ptr<std::atomic<int32_t>[]> update_posted_;  // [proxy]
  std::unique_ptr<float[]> update_scalars_;                // [proxy * 3]
  std::vector<const float*> update_steps_;                 // [proxy]
  std::unique_ptr<HostVector<float>[]> host_chunks_;       // [proxy]
  std::unique_ptr<std::atomic<int32_t>[]> host_stage_;     // [proxy]
  std::atomic<int64_t> norm_posted_{0};

  friend class Registry;
};

// Finds or creates the session of (run_id, site, the caller's current
// iteration of them) for `plan`; `device` is the caller's mesh device index.
// `ordinals[0..num_ordinals)`: see StoragePool::Take.
// (`ordinals` is copied only into a new session: a call's attribute, read in place.)
std::shared_ptr<Session> JoinSession(std::shared_ptr<const Plan> plan, int64_t run_id, int64_t site,
                                     int64_t device, const int64_t* ordinals, size_t num_ordinals);

// Testing hook, exposed by the nanobind module: the next session created (by
// whatever mesh, in this module) loses the first push of `worker`, so its
// proxy must time out. The session that starts next consumes the hook even
// when its mesh has no such worker (then nothing is dropped): it never stays
// armed for a later mesh or step.
void InjectDroppedPush(int64_t worker);
// Testing hook: the next session created takes its storage set's previous
// ready value again (Storage::SameUse), a stale counter of state reused
// across sessions; a proxy's job must refuse it (CheckReadyFlags, service.cc).
void InjectStaleFlags();
int64_t LiveSessions();
// The live sessions of one execution (its sync sites).
std::vector<std::shared_ptr<Session>> SessionsOfRun(int64_t run_id);

// Bounds on what the registry remembers (see session.cc): per-run iteration
// counters of at most kMaxRunsRemembered runs, step counters of at most
// kMaxStepCounters (plan, site) pairs.
inline constexpr int64_t kMaxRunsRemembered = 256;
inline constexpr int64_t kMaxStepCounters = 1024;
// Sizes of the registry's maps, for memory_stats() and tests.
struct RegistryStats {
  int64_t live_sessions = 0, runs_remembered = 0, step_counters = 0;
};
RegistryStats TheRegistryStats();

// Simulated seconds each finished virtual-clock session took (the latest
// device clock when its last device left), in completion order; returns and
// forgets them. coarse_jax reads them to time emulated steps exactly.
std::vector<double> TakeVirtualSpans();

}  // namespace coarse
