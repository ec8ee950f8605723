// The proxies' jobs and the thread pool that runs them (see service.h).
#include "runtime/service.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime/phases.h"
#include "runtime/stream.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// A cached pool: idle threads wait for jobs for kIdle, then exit; a job with
// no idle thread to take it starts a new one. Never destroyed (threads may
// still wait on it while the process exits).
class Pool {
 public:
  void Submit(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    // Every queued job needs a thread of its own: an idle one if there are
    // more idle threads than jobs waiting, else a new one.
    if (idle_ >= static_cast<int64_t>(queue_.size())) {
      cv_.notify_one();
      return;
    }
    ++threads_;
    std::thread([this] { Loop(); }).detach();
  }

  ServiceStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return ServiceStats{running_, threads_};
  }

 private:
  static constexpr auto kIdle = std::chrono::seconds(30);

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      const bool got = cv_.wait_for(lock, kIdle, [&] { return !queue_.empty(); });
      --idle_;
      if (!got) {
        --threads_;
        return;
      }
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
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
  int64_t idle_ = 0, threads_ = 0, running_ = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool;  // never destroyed, see Pool
  return *pool;
}

// Across hosts: reduce-scatter within the host, hand the owned chunks to
// worker k (its stage-1 coarse_proxy_ring call), wait for them summed over
// the hosts (its stage-2 call), then update and all-gather.
ffi::Error RunProxyAcrossHosts(Call& call, Device& dev, ProxyUpdate& update) {
  Session& session = *call.session;
  const int64_t k = call.who.index;
  const std::vector<OwnedRange> ranges = ExchangeRanges(call.plan(), k);
  HostVector<float>& chunks = session.host_chunks(k);
  chunks.assign(ranges.empty() ? 0 : ranges.back().off + (ranges.back().hi - ranges.back().lo),
                0.0f);
  const int64_t n = static_cast<int64_t>(chunks.size());
  ffi::Error err =
      ReducePieces(call, dev, &update, HostsStage{HostsStage::kToHosts, chunks.data(), n});
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
  ffi::Error status = AcquireStorage(call, dev);
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
        ffi::Error synced = dev.SynchronizeHost("the chunks of the other hosts");
        if (status.success()) status = std::move(synced);
      }
    } else {
      status = ReducePieces(call, dev, nullptr, {}, job.in_place);
    }
  }
  if (status.failure()) ReleaseFlags(*session, k);
  // Poisons the session on failure; either way the proxy leaves it.
  (void)FinishCall(call, dev, std::move(status), /*last=*/true);
}

}  // namespace

void StartProxies(const std::shared_ptr<Session>& session, ProxyJob job, MakeProxyDevice make) {
  if (!session->TakeProxyStart()) return;
  auto shared = std::make_shared<const ProxyJob>(std::move(job));
  auto maker = std::make_shared<const MakeProxyDevice>(std::move(make));
  for (int64_t k = 0; k < session->q(); ++k)
    ThePool().Submit([session, k, shared, maker] { RunProxy(session, k, *shared, *maker); });
}

ServiceStats TheServiceStats() { return ThePool().Stats(); }

}  // namespace coarse
