// coarse_probe: time one or two transfers through the runtime's transport.
//
// The profiler (coarse_jax/profile.py) runs this on every device of the mesh
// with up to two (src device, dst device) pairs as an operand, so one
// compiled program per size measures every link. Each source device copies
// the payload into a runtime buffer of its destination and, on an emulated
// interconnect, waits for the booked arrival: the same Reserve + copy + sleep
// a push, ring step or pull does. Sources start each repetition together (a
// barrier), so two pairs in opposite directions measure the link both ways
// at once. Result: seconds per repetition on source devices, 0 elsewhere.
// With a virtual clock (emulator.h) nothing sleeps: a repetition starts at
// the simulated time the barrier opened (the latest source's clock) and
// lasts until the booked arrival, so the result is exact.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/emulator.h"
#include "runtime/session.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

class ProbeSession {
 public:
  ProbeSession(int64_t devices, int64_t nbytes, int sources, const Topology* topo)
      : devices_(devices), sources_(sources), buffers_(devices) {
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

  // True for the last device to leave.
  bool Leave() { return ++left_ == devices_; }

 private:
  int64_t devices_;
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

static ffi::Error ProbeImpl(ffi::RunId run_id, ffi::AnyBuffer who_buf, ffi::AnyBuffer pairs_buf,
                           ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> times,
                           ffi::Dictionary attrs) {
  auto workers = attrs.get<int64_t>("workers");
  auto site = attrs.get<int64_t>("site");
  auto timeout_ms = attrs.get<int64_t>("timeout_ms");
  if (workers.has_error() || site.has_error() || timeout_ms.has_error())
    return ffi::Error::InvalidArgument("coarse_probe: missing workers/site/timeout_ms");
  const int64_t p = workers.value();
  auto who = ReadWho(who_buf, p);
  if (who.has_error()) return who.error();
  if (pairs_buf.element_type() != ffi::DataType::S32 || pairs_buf.element_count() != 4 ||
      times->element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("coarse_probe: expects int32[4] pairs and float32 times");
  const int32_t* pairs = static_cast<const int32_t*>(pairs_buf.untyped_data());
  const int sources = (pairs[0] >= 0) + (pairs[2] >= 0);
  const int64_t me = who.value().device(p);
  const int64_t nbytes = static_cast<int64_t>(payload.size_bytes());

  Topology topo;
  auto emulated = ParseTopology(attrs, p, &topo);
  if (emulated.has_error()) return emulated.error();
  const bool virtual_clock = emulated.value() && topo.virtual_clock;

  std::shared_ptr<ProbeSession> session;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto& slot = g_sessions[{run_id.run_id, site.value()}];
    if (!slot)
      slot = std::make_shared<ProbeSession>(2 * p, nbytes, sources,
                                            emulated.value() ? &topo : nullptr);
    session = slot;
  }

  float* out = static_cast<float*>(times->untyped_data());
  const size_t reps = times->element_count();
  std::fill(out, out + reps, 0.0f);
  ffi::Error status = ffi::Error::Success();
  for (int pair = 0; pair < 2; ++pair) {
    if (pairs[2 * pair] != me) continue;
    const int64_t dst = pairs[2 * pair + 1];
    if (dst < 0 || dst >= 2 * p || dst == me) {
      status = ffi::Error::InvalidArgument("coarse_probe: bad destination device");
      break;
    }
    Clock::time_point clock{};  // simulated time of this source (virtual clock)
    for (size_t rep = 0; rep < reps; ++rep) {
      if (!session->Barrier(std::chrono::milliseconds(timeout_ms.value()), &clock)) {
        status = ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                            "coarse_probe: " + who.value().Describe() +
                                " timed out waiting for the other source of the probe");
        break;
      }
      const Clock::time_point start = virtual_clock ? clock : Clock::now();
      const Clock::time_point arrival =
          session->Reserve(me, dst, static_cast<double>(nbytes), start);
      std::memcpy(session->buffer(dst), payload.untyped_data(), nbytes);
      if (virtual_clock) {
        clock = arrival;
        out[rep] = std::chrono::duration<float>(arrival - start).count();
      } else {
        SleepUntil(arrival);
        out[rep] = std::chrono::duration<float>(Clock::now() - start).count();
      }
    }
  }
  if (session->Leave()) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sessions.erase({run_id.run_id, site.value()});
  }
  return status;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Probe, ProbeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()       // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()   // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()   // int32[4]: (src, dst) device pairs, -1 unused
                                  .Arg<ffi::AnyBuffer>()   // payload, the bytes to move
                                  .Ret<ffi::AnyBuffer>()   // float32[reps] seconds (sources only)
                                  .Attrs<ffi::Dictionary>());  // workers, site, timeout_ms, emu_*

}  // namespace coarse
