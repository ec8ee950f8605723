// One device's part in one session: the Call every phase (phases.h) takes,
// and what every call does first and last whatever its platform or op.
//
// First: the caller's first call of a session waits for the previous user
// of the storage (AcquireStorage). Last: on an error the session is poisoned,
// so peers stop waiting for this device at once instead of timing out; the
// last call of the step on its device publishes its work and leaves the
// session (FinishCall). The handlers (ffi/xla/handler.h) wrap these around the
// XLA translation; the self-test (lab/sync_selftest.h) calls them directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/status.h"

namespace coarse {

struct Call {
  std::shared_ptr<Session> session;
  Who who;
  // This call queued the session's proxy jobs (xla/handler.h StartProxyService).
  bool started_proxies = false;
  const Plan& plan() const { return session->plan(); }
  int64_t device() const { return who.device(session->p()); }  // mesh device index
};

// The caller's first call of a session waits (Device::Acquire) for every
// device's work of the session that used the storage before.
Status AcquireStorage(Call& call, Device& device);

// Checks that a leaf of `dtype` with `element_count` elements (an operand or
// result of `op`) matches leaf `leaf` of the plan. `dtype` nullopt: one the
// runtime does not take (xla/status_xla.h AsDType), refused.
Status CheckLeaf(const Plan& plan, int64_t leaf, std::optional<DType> dtype, size_t element_count,
                 const char* op);

// Returns `status`. A failure poisons the session and ends the device's part
// in it (Session::Finish); on success with `last` (this call ends the
// session on its device: the step, or one iteration of a loop) the device
// publishes its work and finishes its part.
Status FinishCall(Call& call, Device& device, Status status, bool last);

// The factor the rings apply once: 1/p for a mean, else 1.
inline float MeanScale(const Plan& plan) {
  return plan.mean ? 1.0f / static_cast<float>(plan.workers) : 1.0f;
}

}  // namespace coarse
