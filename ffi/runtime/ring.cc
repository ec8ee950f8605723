#include "runtime/ring.h"

#include <cstring>

#include "runtime/cpu_backend.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error RingAllReduce(Session& session, const Who& who, int64_t n, float scale,
                         const RingMember& m,
                         const std::function<std::string(int, int32_t)>& what) {
  const int64_t p = session.p();
  const int64_t half[3] = {0, n / 2, n};
  if (p == 1 && scale != 1.0f) cpu::ScaleF32(m.own, scale, n);  // no ring step to fold it into
  for (int r = 0; r < 2; ++r) {
    m.progress[r]->store(0, std::memory_order_release);
    session.Notify(m.successor_device[r]);
  }
  const int32_t steps = RingSteps(p);
  for (int32_t g = 0; g < steps; ++g) {
    for (int r = 0; r < 2; ++r) {
      ffi::Error err = session.Wait(
          who, Session::Waits::kPeer, [&] { return m.pred_progress[r]->load(std::memory_order_acquire) >= g; },
          [&] { return what(r, g); });
      if (err.failure()) return err;
      // Chunk c of half r: [base + c*H/p, base + (c+1)*H/p).
      const int64_t base = half[r], H = half[r + 1] - half[r];
      const int64_t q = m.position[r];
      const bool reducing = g < p - 1;
      const int64_t t = reducing ? g : g - (p - 1);
      const int64_t c = ((reducing ? q - 1 - t : q - t) % p + p) % p;
      const int64_t lo = base + c * H / p, hi = base + (c + 1) * H / p;
      if (hi > lo) {
        if (reducing && g == p - 2 && scale != 1.0f)
          cpu::AddScaleF32(m.own + lo, m.pred[r] + lo, scale, hi - lo);
        else if (reducing)
          cpu::AddF32(m.own + lo, m.pred[r] + lo, hi - lo);
        else
          std::memcpy(m.own + lo, m.pred[r] + lo, (hi - lo) * sizeof(float));
      }
      m.progress[r]->store(g + 1, std::memory_order_release);
      session.Notify(m.successor_device[r]);
    }
  }
  return ffi::Error::Success();
}

}  // namespace coarse
