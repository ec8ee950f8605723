// What every coarse_* handler does first and last, on any platform: find the
// plan and the session, learn which device is calling, make the caller's
// first call of the session wait for the previous user of the storage, and
// on the way out either leave the session (last call of the step on this
// device) or poison it (an error, so peers stop waiting for this device at
// once instead of timing out).
//
// The protocol of each call (push.cc, proxy_ring.cc, worker_ring.cc,
// pull.cc) is written once against runtime/device.h; handlers_cpu.cc and
// cuda/handlers_cuda.cc bind it to XLA for each platform.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/cpu_backend.h"
#include "runtime/device.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

struct Call {
  std::shared_ptr<Session> session;
  Who who;
  const Plan& plan() const { return session->plan(); }
  int64_t device() const { return who.device(session->p()); }  // mesh device index
};

// How the caller is identified: on CPU by the int32[2] (tier, data) operand,
// read on the host; on CUDA that operand lives on the GPU, so by the device
// ordinal XLA runs the call on, looked up in the "ordinals" attribute.
struct Caller {
  const xla::ffi::AnyBuffer* who_operand = nullptr;
  std::optional<int64_t> ordinal;
};

// Attributes read here besides the plan's (see plan.h): site (int64, which
// coarse sync of the program), last (int64 0/1, this call ends the step on
// its device), ordinals (int64[2p], the platform's device number of every
// mesh device; optional on CPU).
xla::ffi::ErrorOr<Call> BeginCall(xla::ffi::RunId run_id, const Caller& caller,
                                  const xla::ffi::Dictionary& attrs);

// The caller's first call of a session waits (Device::Acquire) for every
// device's work of the session that used the storage before.
xla::ffi::Error AcquireStorage(Call& call, Device& device);

// Checks that operand/result `buf` matches leaf `leaf` of the plan.
xla::ffi::Error CheckLeaf(const Plan& plan, int64_t leaf, xla::ffi::DataType dtype,
                          size_t element_count, const char* op);

xla::ffi::Error EndCall(Call& call, Device& device, xla::ffi::Error status,
                        const xla::ffi::Dictionary& attrs);

// BeginCall, a device from `make_device(call)`, AcquireStorage, `body(call,
// device)`, EndCall: the whole life of one handler call.
template <typename MakeDevice, typename Body>
xla::ffi::Error RunCall(xla::ffi::RunId run_id, const Caller& caller,
                        const xla::ffi::Dictionary& attrs, MakeDevice&& make_device, Body&& body) {
  auto begun = BeginCall(run_id, caller, attrs);
  if (begun.has_error()) return begun.error();
  Call call = std::move(begun.value());
  auto device = make_device(call);
  if (device.has_error()) {
    call.session->Poison(device.error().message());
    return device.error();
  }
  Device& dev = *device.value();
  xla::ffi::Error status = AcquireStorage(call, dev);
  if (status.success()) status = body(call, dev);
  return EndCall(call, dev, std::move(status), attrs);
}

// The protocol of each custom call (one file each).
xla::ffi::Error PushBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                         xla::ffi::RemainingRets outs, const xla::ffi::Dictionary& attrs);
xla::ffi::Error ProxyRingBody(Call& call, Device& dev, xla::ffi::Result<xla::ffi::AnyBuffer> token);
xla::ffi::Error WorkerRingBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                               xla::ffi::RemainingRets outs);
xla::ffi::Error PullBody(Call& call, Device& dev, xla::ffi::RemainingRets outs);

// The protocol's phases without XLA types, which the bodies above wrap and
// the self-test (sync_selftest.h) drives directly. A LeafResolver gives the
// caller's buffer of a plan leaf.
struct LeafRef {
  void* data;
  xla::ffi::DataType dtype;
};
using LeafResolver = std::function<LeafRef(int64_t leaf)>;

// A worker pushes pieces [first_piece, first_piece + num_pieces).
xla::ffi::Error PushPieces(Call& call, Device& dev, int64_t first_piece, int64_t num_pieces,
                           const LeafResolver& leaf_of);
// A proxy reduces every piece with the other proxies.
xla::ffi::Error ReducePieces(Call& call, Device& dev);
// Workers gather `in_runs` (the leading leaves) into their scratch and ring-
// reduce it; every device then scatters the result into `out_runs` (a proxy
// from its worker's scratch, after the hand-over).
xla::ffi::Error ReduceLeading(Call& call, Device& dev, const std::vector<LeafRun>& in_runs,
                              const std::vector<LeafRun>& out_runs);
// Worker `who` runs both rings over the workers' scratch.
xla::ffi::Error WorkerRingAllReduce(Session& session, Device& dev, const Who& who);
// Every device writes the reduced proxy pieces into its leaves.
xla::ffi::Error PullPieces(Call& call, Device& dev, const LeafResolver& leaf_of);

inline char* ElementPtr(void* base, xla::ffi::DataType dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * xla::ffi::ByteWidth(dtype);
}

inline float MeanScale(const Plan& plan) {
  return plan.mean ? 1.0f / static_cast<float>(plan.workers) : 1.0f;
}

}  // namespace coarse
