// RingAllReduce (see ring.h): the two opposite rings' reduce-scatter and
// all-gather steps over any Device.
#include "runtime/ring.h"

#include <algorithm>

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// Records that member `m` completed step g of ring r and wakes its successor.
void NoteStep(Session& session, const RingMember& m, int r, int32_t g) {
  if (m.step_times[r])
    m.step_times[r][g].store(Ticks(session.Now(m.self_device)), std::memory_order_release);
  m.progress[r]->store(g, std::memory_order_release);
  session.Notify(m.successor_device[r]);
}

// Steps [from, to) of both rings. The completion of step `to` - 1 is
// announced only if `announce_last` (see RingReduceScatter).
ffi::Error RunSteps(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                    const RingMember& m, const std::function<std::string(int, int32_t)>& what,
                    int32_t from, int32_t to, bool announce_last) {
  const int64_t p = session.p();
  const int64_t half[3] = {0, n / 2, n};
  for (int32_t g = from; g < to; ++g) {
    const bool reducing = g < p - 1;
    const int64_t t = reducing ? g : g - (p - 1);
    int64_t lo[2], hi[2];
    Clock::time_point arrival[2];
    // Both rings book their transfer before either sleeps: the two
    // directions run at the same time, as on full-duplex links.
    for (int r = 0; r < 2; ++r) {
      ffi::Error err = session.Wait(
          who, Session::Waits::kPeer,
          [&] { return m.pred_progress[r]->load(std::memory_order_acquire) >= g; },
          [&] { return what(r, g); });
      if (err.failure()) return err;
      err = dev.Acquire(m.pred_device[r]);
      if (err.failure()) return err;
      // Chunk c of half r: [base + c*H/p, base + (c+1)*H/p).
      const int64_t base = half[r], H = half[r + 1] - half[r];
      const int64_t q = m.position[r];
      const int64_t c = ((reducing ? q - 1 - t : q - t) % p + p) % p;
      lo[r] = base + c * H / p;
      hi[r] = base + (c + 1) * H / p;
      Clock::time_point ready = session.Now(m.self_device);
      if (m.pred_step_times[r])
        ready = std::max(ready, AtTicks(m.pred_step_times[r][g].load(std::memory_order_acquire)));
      arrival[r] = session.Reserve(m.pred_device[r], m.self_device,
                                   (hi[r] - lo[r]) * m.wire_bytes_per_elem, ready);
    }
    for (int r = 0; r < 2; ++r) {
      // The copy/add happens inside the emulated transfer window: the host's
      // own cost is hidden while it is shorter than the link's.
      const int64_t n_chunk = hi[r] - lo[r];
      if (n_chunk > 0) {
        const float step_scale = reducing && g == p - 2 ? scale : 1.0f;
        ffi::Error err =
            reducing ? dev.AddFrom(m.own + lo[r], m.pred[r] + lo[r], m.pred_device[r], n_chunk,
                                   step_scale)
                     : dev.CopyFrom(m.own + lo[r], m.pred[r] + lo[r], m.pred_device[r], n_chunk);
        if (err.failure()) return err;
        err = dev.Publish();
        if (err.failure()) return err;
      }
      session.AdvanceTo(m.self_device, arrival[r]);
      if (g + 1 < to || announce_last) NoteStep(session, m, r, g + 1);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error RingReduceScatter(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                             const RingMember& m,
                             const std::function<std::string(int, int32_t)>& what, bool announce) {
  const int64_t p = session.p();
  if (p == 1 && scale != 1.0f) {  // no ring step to fold it into
    ffi::Error e = dev.Scale(m.own, n, scale);
    if (e.failure()) return e;
  }
  ffi::Error e = dev.Publish();  // the member's starting values (read at step 0)
  if (e.failure()) return e;
  const int32_t last = static_cast<int32_t>(p - 1);
  // With p == 1 the starting values are already the owned result.
  if (last > 0 || announce)
    for (int r = 0; r < 2; ++r) NoteStep(session, m, r, 0);
  return RunSteps(session, dev, who, n, scale, m, what, 0, last, announce);
}

ffi::Error RingAnnounceOwned(Session& session, Device& dev, const RingMember& m) {
  ffi::Error e = dev.Publish();
  if (e.failure()) return e;
  const int32_t last = static_cast<int32_t>(session.p() - 1);
  for (int r = 0; r < 2; ++r) NoteStep(session, m, r, last);
  return ffi::Error::Success();
}

ffi::Error RingAllGather(Session& session, Device& dev, const Who& who, int64_t n,
                         const RingMember& m,
                         const std::function<std::string(int, int32_t)>& what) {
  const int32_t last = static_cast<int32_t>(session.p() - 1);
  return RunSteps(session, dev, who, n, 1.0f, m, what, last, RingSteps(session.p()), true);
}

ffi::Error RingAllReduce(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                         const RingMember& m,
                         const std::function<std::string(int, int32_t)>& what) {
  ffi::Error e = RingReduceScatter(session, dev, who, n, scale, m, what, true);
  if (e.failure()) return e;
  return RingAllGather(session, dev, who, n, m, what);
}

}  // namespace coarse
