// The proxies' jobs and the thread pool that runs them (see service.h).
#include "runtime/service.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime/mailbox.h"
#include "runtime/phases.h"
#include "runtime/stream.h"
#include "runtime/wakeups.h"

namespace coarse {

namespace {

// A cached pool: idle threads beyond the reservation wait for jobs for the
// idle time, then exit; a job with no idle thread to take it starts a new
// one. Never destroyed (threads may still wait on it while the process exits).
class Pool {
 public:
  void Submit(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
    // Every queued job needs a thread of its own: an idle one if there are
    // more idle threads than jobs waiting, else a new one. A spinning idle
    // thread sees queued_; a parked one needs the notify (parked_ is read
    // under mu_, where a thread registers before it sleeps: mailbox.h).
    if (idle_ >= static_cast<int64_t>(queue_.size())) {
      if (parked_ == 0) {
        CountWakeup(Wakeup::kNotifyNoSleeper);
        return;
      }
      CountWakeup(Wakeup::kNotifySleeper);
      cv_.notify_one();
      return;
    }
    StartLocked();
  }

  void Reserve(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ = std::max(reserved_, n);
    while (threads_ < reserved_) StartLocked();
  }

  int64_t SetIdleMs(int64_t ms) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t old = idle_ms_;
    idle_ms_ = std::max<int64_t>(ms, 1);  // each thread's next idle wait uses it
    return old;
  }

  ServiceStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return ServiceStats{running_, threads_};
  }

 private:
  void StartLocked() {
    ++threads_;
    CountWakeup(Wakeup::kThreadStart);
    std::thread([this] {
      pthread_setname_np(pthread_self(), "coarse service");  // top -H, gdb, py-spy
      Loop();
    }).detach();
  }

  // Waits for a job: spins for the mailboxes' budget (mailbox.h; on a host
  // of at most 2 hardware threads it yields once), then parks until a job
  // comes or the idle time passes.
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      bool got = !queue_.empty();
      if (!got) {
        lock.unlock();
        got = SpinFor([&] { return queued_.load(std::memory_order_acquire) > 0; });
        lock.lock();
        got = got && !queue_.empty();  // another idle thread may have taken it
        if (got) CountWakeup(Wakeup::kSpinFound);
      }
      if (!got) {
        // Each sleep counts as a park, but its time is idle time between
        // jobs, not a sync's: not added to the time parked.
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(idle_ms_);
        bool slept = false;
        while (queue_.empty() && std::chrono::steady_clock::now() < until) {
          CountWakeup(Wakeup::kPark);
          ++parked_;
          cv_.wait_until(lock, until);
          --parked_;
          slept = true;
        }
        got = !queue_.empty();
        if (got && slept) CountWakeup(Wakeup::kWokeWithWork);
      }
      --idle_;
      if (!got) {
        if (threads_ <= reserved_) continue;  // a reserved thread stays
        --threads_;
        return;
      }
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
      ++running_;
      lock.unlock();
      job();
      lock.lock();
      --running_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int64_t idle_ = 0, threads_ = 0, running_ = 0, reserved_ = 0;
  int64_t parked_ = 0;              // idle threads asleep on cv_
  std::atomic<int64_t> queued_{0};  // queue_.size(), for the spinning threads
  int64_t idle_ms_ = 30000;
};

Pool& ThePool() {
  static Pool* pool = new Pool;  // never destroyed, see Pool
  return *pool;
}

// Across hosts: reduce-scatter within the host, hand the owned chunks to
// worker k (its stage-1 coarse_proxy_ring call), wait for them summed over
// the hosts (its stage-2 call), then update and all-gather.
Status RunProxyAcrossHosts(Call& call, Device& dev, ProxyUpdate& update) {
  Session& session = *call.session;
  const int64_t k = call.who.index;
  const std::vector<OwnedRange> ranges = ExchangeRanges(call.plan(), k);
  HostVector<float>& chunks = session.host_chunks(k);
  chunks.assign(ranges.empty() ? 0 : ranges.back().off + (ranges.back().hi - ranges.back().lo),
                0.0f);
  const int64_t n = static_cast<int64_t>(chunks.size());
  Status err = ReducePieces(call, dev, &update, HostsStage{HostsStage::kToHosts, chunks.data(), n});
  // The chunks are host memory that worker k reads once they are posted: on
  // a device with streams the copies into them must have run first.
  if (err.success()) err = dev.SynchronizeHost("the chunks for the other hosts");
  if (err.failure()) return err;
  session.PostHostChunks(k, 1);
  err = session.Wait(
      call.who, Session::Waits::kPeer, [&] { return session.HostChunksAt(k, 2); },
      [&] {
        return "worker " + std::to_string(call.plan().group_leader(k)) +
               " to hand back the chunks summed over the hosts (its second coarse_proxy_ring "
               "call)";
      });
  if (err.failure()) return err;
  return ReducePieces(call, dev, &update, HostsStage{HostsStage::kFromHosts, chunks.data(), n});
}

// A failed proxy in host memory releases the workers' streams waiting on
// its ready flags (Stream::WaitValue: on CUDA they would wait forever); the
// step fails on the host, with the job's error, all the same.
void ReleaseFlags(Session& session, int64_t k) {
  for (int64_t s = 0; s < session.plan().num_pieces(); ++s)
    if (uint32_t* flag = session.ready_flag(k, s)) WriteFlag(flag, session.ready_value());
}

// Before a proxy in host memory reduces anything: none of its ready flags
// (Storage::ready_flags) may already say "final in this session", or a
// pull's copies would pass their wait over what an earlier session left
// (issue 62). An error naming the piece and the values, the session
// poisoned, if one does.
Status CheckReadyFlags(Session& session, int64_t proxy) {
  const Plan& plan = session.plan();
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    const uint32_t* flag = session.ready_flag(proxy, s);
    if (flag == nullptr) return Status::Success();
    const uint32_t held = ReadFlag(flag);
    if (!FlagReached(held, session.ready_value())) continue;
    const std::string msg =
        "coarse_jax: " + session.proxy(proxy).Describe() + session.DescribeStep() +
        ": stale state in the storage set this session took from the pool: the ready flag of " +
        plan.DescribePiece(s) + " already holds " + std::to_string(held) +
        ", the value that tells the workers' pulls it is final in this session (" +
        std::to_string(session.ready_value()) +
        "), before this proxy reduced it, so a pull would copy what an earlier session left. "
        "The step was stopped before any pull could. This is a coarse_jax bug: please report "
        "it with the steps the process ran.";
    session.Poison(msg);
    return Status::Internal(msg);
  }
  return Status::Success();
}

// Counts a proxy's job starting, `submitted` when the first worker call
// queued it, and whether it starts late: a push of its session is already
// there (the job was not ready before the first push).
void CountJobStart(Session& session, int64_t k, std::chrono::steady_clock::time_point submitted) {
  CountWakeup(Wakeup::kJobStarted);
  AddJobStartNs(std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - submitted)
                    .count());
  for (int64_t s = 0; s < session.plan().num_pieces(); ++s) {
    if (session.arrived(k, s).load(std::memory_order_acquire) > 0 ||
        session.pushes_of(s).load(std::memory_order_acquire) > 0) {
      CountWakeup(Wakeup::kJobLate);
      return;
    }
  }
}

// Proxy k's part of the session: what its coarse_proxy_ring call did when
// the proxies ran the workers' program, then leaving the session.
void RunProxy(const std::shared_ptr<Session>& session, int64_t k, const ProxyJob& job,
              const MakeProxyDevice& make) {
  Call call{session, session->proxy(k)};
  auto device = make(call);
  if (device.has_error()) {
    ReleaseFlags(*session, k);
    session->Poison(std::string(device.error().message()));
    session->Finish(call.device());
    return;
  }
  Device& dev = *device.value();
  Status status = AcquireStorage(call, dev);
  if (status.success()) status = CheckReadyFlags(*session, k);
  if (status.success()) {
    if (job.store) {
      ProxyUpdate update{job.store, &job.spec, 0.0f, 0.0f, 0.0f, {}};
      update.from_worker = true;
      status = job.across_hosts ? RunProxyAcrossHosts(call, dev, update)
                                : ReducePieces(call, dev, &update);
      // Across hosts the device's copies touch the session's host chunks:
      // done before the job leaves (the session may end as soon as it has),
      // whether or not the job failed.
      if (job.across_hosts) {
        Status synced = dev.SynchronizeHost("the chunks of the other hosts");
        if (status.success()) status = std::move(synced);
      }
    } else {
      status = ReducePieces(call, dev, nullptr, {}, job.in_place);
    }
  }
  if (status.success()) status = dev.Flush();  // what the job's device held back
  if (status.failure()) ReleaseFlags(*session, k);
  // Poisons the session on failure; either way the proxy leaves it.
  (void)FinishCall(call, dev, std::move(status), /*last=*/true);
}

}  // namespace

bool StartProxies(const std::shared_ptr<Session>& session, ProxyJob job, MakeProxyDevice make) {
  if (!session->TakeProxyStart()) return false;
  ReserveServiceThreads(2 * session->q());  // a no-op after the first step
  auto shared = std::make_shared<const ProxyJob>(std::move(job));
  auto maker = std::make_shared<const MakeProxyDevice>(std::move(make));
  for (int64_t k = 0; k < session->q(); ++k)
    ThePool().Submit([session, k, shared, maker, submitted = std::chrono::steady_clock::now()] {
      CountJobStart(*session, k, submitted);
      RunProxy(session, k, *shared, *maker);
    });
  return true;
}

ServiceStats TheServiceStats() { return ThePool().Stats(); }

void ReserveServiceThreads(int64_t n) { ThePool().Reserve(n); }

int64_t SetServiceIdleMs(int64_t ms) { return ThePool().SetIdleMs(ms); }

}  // namespace coarse
