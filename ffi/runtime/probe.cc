// RunProbe: the probe's meeting point (one ProbeSession per execution and
// call site, with a barrier per repetition) and its timed copies; see probe.h.
//
// On an emulated interconnect with the real clock the probe times the
// emulated link, not the host: the copy into the destination's buffer runs
// before the clock starts (host work is no part of an emulated link, as the
// virtual clock charges it nothing; a 16 MiB copy on a busy host can outlast
// the link it stands for and hide the difference between two links), and the
// source waits for the booked arrival by sleeping until shortly before it and
// spinning the rest (kSpinTail), so the OS's wake-up delay (tens of us,
// as large as a link's latency) is not measured as link time.
#include "runtime/probe.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace coarse {

namespace {

// How long before an emulated arrival the probe stops sleeping and spins.
constexpr std::chrono::microseconds kSpinTail{2000};

// Real clock: until `t`, sleeping while more than kSpinTail is left, then spinning.
void WaitPrecisely(Clock::time_point t) {
  if (t - Clock::now() > kSpinTail) std::this_thread::sleep_until(t - kSpinTail);
  // No yield: on a busy core it would hand the rest of a time slice (ms) to another process.
  while (Clock::now() < t) {
  }
}

class ProbeSession {
 public:
  // `callers`: the calls that leave; `devices`: the buffers (p + q).
  ProbeSession(int64_t callers, int64_t devices, int64_t nbytes, int sources, const Topology* topo)
      : callers_(callers), sources_(sources), buffers_(devices) {
    for (auto& b : buffers_) b.reset(new char[std::max<int64_t>(1, nbytes)]);
    if (topo) emulator_ = std::make_unique<Emulator>(*topo);
  }

  char* buffer(int64_t device) { return buffers_[device].get(); }

  Clock::time_point Reserve(int64_t src, int64_t dst, double bytes, Clock::time_point start) {
    return emulator_ ? emulator_->Reserve(src, dst, bytes, start) : start;
  }

  // All sources arrive before any of them starts the next repetition.
  // `clock`: the caller's simulated time (virtual clock), replaced by the
  // time the barrier opened. False on timeout.
  bool Barrier(std::chrono::milliseconds timeout, Clock::time_point* clock) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = generation_;
    opens_at_ = std::max(opens_at_, *clock);
    if (++waiting_ == sources_) {
      waiting_ = 0;
      ++generation_;
      opened_at_ = opens_at_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, timeout, [&] { return generation_ != gen; })) {
      return false;
    }
    // The next opening is only computed once every source has read this one.
    *clock = opened_at_;
    return true;
  }

  // True for the last caller to leave.
  bool Leave() { return ++left_ == callers_; }

 private:
  int64_t callers_;
  int sources_;
  std::vector<std::unique_ptr<char[]>> buffers_;
  std::unique_ptr<Emulator> emulator_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  int64_t generation_ = 0;
  Clock::time_point opens_at_{}, opened_at_{};  // virtual clock: simulated times
  std::atomic<int64_t> left_{0};
};

std::mutex g_mu;
std::map<std::pair<int64_t, int64_t>, std::shared_ptr<ProbeSession>> g_sessions;

}  // namespace

namespace {

// One source identity's part: device `me` times its transfers (if the pairs
// name it as a source) into out[0, reps).
Status RunSource(const ProbeRequest& r, ProbeSession& session, int64_t me, float* out,
                 const std::string& who) {
  const int64_t p = r.workers;
  const int32_t* pairs = r.pairs;
  const int64_t nbytes = r.nbytes;
  const bool virtual_clock = r.topology && r.topology->virtual_clock;
  const size_t reps = r.reps;
  std::fill(out, out + reps, 0.0f);
  for (int pair = 0; pair < 2; ++pair) {
    if (pairs[2 * pair] != me) continue;
    const int64_t dst = pairs[2 * pair + 1];
    if (dst < 0 || dst >= p + r.proxies || dst == me)
      return Status::InvalidArgument("coarse_probe: bad destination device");
    Clock::time_point clock{};  // simulated time of this source (virtual clock)
    for (size_t rep = 0; rep < reps; ++rep) {
      if (!session.Barrier(r.timeout, &clock)) {
        return Status(
            StatusCode::kDeadlineExceeded,
            "coarse_probe: " + who + " timed out waiting for the other source of the probe");
      }
      if (virtual_clock) {
        const Clock::time_point arrival =
            session.Reserve(me, dst, static_cast<double>(nbytes), clock);
        std::memcpy(session.buffer(dst), r.payload, nbytes);
        out[rep] = std::chrono::duration<float>(arrival - clock).count();
        clock = arrival;
      } else if (r.topology) {
        // Emulated link, real clock: the copy first, then the link's own time (see the top).
        std::memcpy(session.buffer(dst), r.payload, nbytes);
        const Clock::time_point start = Clock::now();
        WaitPrecisely(session.Reserve(me, dst, static_cast<double>(nbytes), start));
        out[rep] = std::chrono::duration<float>(Clock::now() - start).count();
      } else {
        // The host's own link: the copy is the transfer.
        const Clock::time_point start = Clock::now();
        std::memcpy(session.buffer(dst), r.payload, nbytes);
        out[rep] = std::chrono::duration<float>(Clock::now() - start).count();
      }
    }
  }
  return Status::Success();
}

}  // namespace

Status RunProbe(const ProbeRequest& r) {
  const int64_t p = r.workers;
  const int32_t* pairs = r.pairs;
  const int sources = (pairs[0] >= 0) + (pairs[2] >= 0);
  const int64_t me = r.who.device(p);
  // With host proxies only the p workers call; otherwise every device does.
  const int64_t callers = r.host_proxies ? p : p + r.proxies;

  std::shared_ptr<ProbeSession> session;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto& slot = g_sessions[{r.run_id, r.site}];
    if (!slot)
      slot = std::make_shared<ProbeSession>(callers, p + r.proxies, r.nbytes, sources, r.topology);
    session = slot;
  }

  Status status = Status::Success();
  Status hosted = Status::Success();
  std::thread host_proxy;
  if (r.host_proxies) {
    float* second = r.times + r.reps;
    if (me < r.proxies) {
      const std::string who =
          "host proxy " + std::to_string(me) + " (run by " + r.who.Describe() + ")";
      host_proxy =
          std::thread([&, second, who] { hosted = RunSource(r, *session, p + me, second, who); });
    } else {
      std::fill(second, second + r.reps, 0.0f);
    }
  }
  status = RunSource(r, *session, me, r.times, r.who.Describe());
  if (host_proxy.joinable()) host_proxy.join();
  if (status.success()) status = hosted;
  if (session->Leave()) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sessions.erase({r.run_id, r.site});
  }
  return status;
}

}  // namespace coarse
