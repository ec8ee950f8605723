// What every coarse_* handler does first and last: find the plan and the
// session, learn which device is calling, and on the way out either leave the
// session (last call of the step on this device) or poison it (an error, so
// peers stop waiting for this device at once instead of timing out).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/cpu_backend.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

struct Call {
  std::shared_ptr<Session> session;
  Who who;
  const Plan& plan() const { return session->plan(); }
};

// Attributes read here besides the plan's (see plan.h): site (int64, which
// coarse sync of the program), last (int64 0/1, this call ends the step on
// its device).
xla::ffi::ErrorOr<Call> BeginCall(xla::ffi::RunId run_id, xla::ffi::AnyBuffer who,
                                  const xla::ffi::Dictionary& attrs);

// Checks that operand/result `buf` matches leaf `leaf` of the plan.
xla::ffi::Error CheckLeaf(const Plan& plan, int64_t leaf, xla::ffi::DataType dtype,
                          size_t element_count, const char* op);

xla::ffi::Error EndCall(Call& call, xla::ffi::Error status, const xla::ffi::Dictionary& attrs);

inline char* ElementPtr(void* base, xla::ffi::DataType dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * xla::ffi::ByteWidth(dtype);
}

inline float MeanScale(const Plan& plan) {
  return plan.mean ? 1.0f / static_cast<float>(plan.workers) : 1.0f;
}

}  // namespace coarse
