// RingAllReduce (see ring.h): the two opposite rings' reduce-scatter and
// all-gather steps over any Device.
#include "runtime/ring.h"

#include <algorithm>
#include <string>

namespace coarse {

namespace {

// Records that member `m` completed step g of ring r (at time `at`, default
// now) and wakes its successor.
void NoteStep(Session& session, const RingMember& m, int r, int32_t g,
              std::optional<Clock::time_point> at = std::nullopt) {
  if (m.step_times[r])
    m.step_times[r][g].store(Ticks(at ? *at : session.Now(m.self_device)),
                             std::memory_order_release);
  // A group's counters together, then one wake-up for all of them.
  for (int64_t i = 0; i < m.rows; ++i)
    m.progress[r][i * m.progress_stride].store(g, std::memory_order_release);
  session.Notify(m.successor_device[r]);
}

// Whether the ring r predecessor completed step g of every buffer of the group.
bool PredDone(const RingMember& m, int r, int32_t g) {
  for (int64_t i = 0; i < m.rows; ++i)
    if (m.pred_progress[r][i * m.progress_stride].load(std::memory_order_acquire) < g) return false;
  return true;
}

// Steps [from, to) of both rings. The completion of step `to` - 1 is
// announced only if `announce_last` (see RingReduceScatter).
Status RunSteps(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                const RingMember& m, FunctionRef<std::string(int, int32_t)> what, int32_t from,
                int32_t to, bool announce_last) {
  const int64_t p = m.members;
  // The member's time in the emulated schedule: the latest arrival it has
  // waited for. Steps are booked from it, not from when the thread woke up:
  // on the real clock a sleep overshoots and a wake-up through the
  // predecessor's notification lags, and booking from those compounded over
  // the 2(p-1) lockstep steps (~7 ms a step at x300, 1.7% of the AllReduce
  // baseline's time). Host delays still show when they outlast a transfer.
  // On the virtual clock this equals session.Now (nothing else moves this
  // device's clock meanwhile).
  Clock::time_point emu_now = session.Now(m.self_device);
  for (int32_t g = from; g < to; ++g) {
    const bool reducing = g < p - 1;
    int64_t lo[2], hi[2];
    Clock::time_point arrival[2];
    // Both rings book their transfer before either sleeps: the two
    // directions run at the same time, as on full-duplex links.
    for (int r = 0; r < 2; ++r) {
      Status err = session.Wait(
          who, Session::Waits::kPeer, [&] { return PredDone(m, r, g); },
          [&] { return what(r, g); });
      if (err.failure()) return err;
      err = dev.Acquire(m.pred_device[r]);
      if (err.failure()) return err;
      RingChunk(r, g, m.position[r], p, n, &lo[r], &hi[r]);
      Clock::time_point ready = emu_now;
      if (g == 0 && m.values_ready) ready = std::min(ready, *m.values_ready);
      if (m.pred_step_times[r])
        ready = std::max(ready, AtTicks(m.pred_step_times[r][g].load(std::memory_order_acquire)));
      arrival[r] = session.Reserve(m.pred_device[r], m.self_device,
                                   (hi[r] - lo[r]) * m.rows * m.wire_bytes_per_elem, ready);
    }
    // The copies/adds of both rings happen inside the emulated transfer
    // windows, before either sleeps: the host's own cost is hidden while it
    // is shorter than the links'. (Ring 1's add used to follow ring 0's
    // sleep, so every step paid it on top of the link time.)
    const bool final_chunk = (!reducing || g == p - 2) && (g + 1 < to || announce_last);
    for (int r = 0; r < 2; ++r) {
      const int64_t n_chunk = hi[r] - lo[r];
      if (n_chunk == 0) continue;
      const float step_scale = reducing && g == p - 2 ? scale : 1.0f;
      const Rows rows{m.rows, m.own_pitch, m.pred_pitch[r]};
      Status err = reducing ? dev.AddFrom(m.own + lo[r], m.pred[r] + lo[r], m.pred_device[r],
                                          n_chunk, step_scale, rows)
                            : dev.CopyFrom(m.own + lo[r], m.pred[r] + lo[r], m.pred_device[r],
                                           n_chunk, rows);
      if (err.failure()) return err;
      err = dev.Publish();
      if (err.failure()) return err;
      if (final_chunk && m.on_final) {
        err = m.on_final(lo[r], hi[r]);
        if (err.failure()) return err;
      }
    }
    for (int r = 0; r < 2; ++r) {
      session.AdvanceTo(m.self_device, arrival[r]);
      emu_now = std::max(emu_now, arrival[r]);
      if (g + 1 < to || announce_last) NoteStep(session, m, r, g + 1, emu_now);
    }
  }
  return Status::Success();
}

}  // namespace

void RingChunk(int ring, int32_t g, int64_t position, int64_t p, int64_t n, int64_t* lo,
               int64_t* hi) {
  const bool reducing = g < p - 1;
  const int64_t t = reducing ? g : g - (p - 1);
  // Chunk c of half r: [base + c*H/p, base + (c+1)*H/p).
  const int64_t base = ring == 0 ? 0 : n / 2, H = ring == 0 ? n / 2 : n - n / 2;
  const int64_t c = ((reducing ? position - 1 - t : position - t) % p + p) % p;
  *lo = base + c * H / p;
  *hi = base + (c + 1) * H / p;
}

Status RingReduceScatter(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                         const RingMember& m, FunctionRef<std::string(int, int32_t)> what,
                         bool announce) {
  const int64_t p = m.members;
  if ((m.rows > 1 || m.rows < 1) && (m.step_times[0] || m.on_final || p == 1))
    return Status::Internal(
        "coarse_jax: a ring group of " + std::to_string(m.rows) +
        " buffers on emulated links, with on_final or alone (ring.h: RingMember::rows)");
  if (p == 1 && scale != 1.0f) {  // no ring step to fold it into
    Status e = dev.Scale(m.own, n, scale);
    if (e.failure()) return e;
  }
  Status e = dev.Publish();  // the member's starting values (read at step 0)
  if (e.failure()) return e;
  const int32_t last = static_cast<int32_t>(p - 1);
  // With p == 1 the starting values are already the owned result.
  if (last > 0 || announce)
    for (int r = 0; r < 2; ++r) {
      std::optional<Clock::time_point> at;
      if (m.values_ready) at = std::min(session.Now(m.self_device), *m.values_ready);
      NoteStep(session, m, r, 0, at);
    }
  if (p == 1 && announce && m.on_final && n > 0) {
    e = m.on_final(0, n);
    if (e.failure()) return e;
  }
  return RunSteps(session, dev, who, n, scale, m, what, 0, last, announce);
}

Status RingAnnounceOwned(Session& session, Device& dev, const RingMember& m) {
  Status e = dev.Publish();
  if (e.failure()) return e;
  const int32_t last = static_cast<int32_t>(m.members - 1);
  for (int r = 0; r < 2; ++r) NoteStep(session, m, r, last);
  return Status::Success();
}

Status RingAllGather(Session& session, Device& dev, const Who& who, int64_t n, const RingMember& m,
                     FunctionRef<std::string(int, int32_t)> what) {
  const int32_t last = static_cast<int32_t>(m.members - 1);
  return RunSteps(session, dev, who, n, 1.0f, m, what, last, RingSteps(m.members), true);
}

Status RingAllReduce(Session& session, Device& dev, const Who& who, int64_t n, float scale,
                     const RingMember& m, FunctionRef<std::string(int, int32_t)> what) {
  Status e = RingReduceScatter(session, dev, who, n, scale, m, what, true);
  if (e.failure()) return e;
  return RingAllGather(session, dev, who, n, m, what);
}

}  // namespace coarse
