// A proxy in host memory on a platform with device streams (the streams
// backend, CUDA): what it is on a GPU machine. Its storage is pinned host
// memory; its sums and optimizer run on the host, in the proxy's job thread,
// on `host` (the CPU platform's inline stream: its loops); the workers
// reach it by copies on their own streams (StreamDevice::PeerCopy).
//
// Ordering, with nothing enqueued on its side:
//  * a worker's push is a device-to-host copy on the worker's stream, then
//    that worker's event (Publish); before the proxy reads a worker's data
//    it waits on the host for that event (Acquire -> Stream::HostWait);
//  * what the proxy makes final is announced by its ready flags
//    (Session::ready_flag), which the workers' streams wait for before they
//    copy it back (Device::WaitFlag): no worker's host thread waits on it.
// A worker's event is recorded, after its pull's flag waits, only once the
// proxies have left the session (FinishCall), so a host wait here never
// waits behind a flag this proxy has still to write.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace coarse {

class HostProxyDevice final : public Device {
 public:
  // `host`: the host's stream whose work is done when enqueued (the CPU
  // platform's inline stream, Stream::DoneWhenEnqueued), running the host
  // loops on this job's thread; `waits`: a stream of this platform, used
  // only for HostWait; `workers`: mesh devices below it are workers; `who`:
  // how errors name this proxy and the step; `timeout`: a host wait's
  // limit; `chaos_seed` (the stream-semantics CPU backend's
  // COARSE_JAX_STREAM_CHAOS): seeded random stalls before its sums and
  // optimizer, so a worker's stream that reads a piece before the proxy made
  // it final reads it stale (tests).
  HostProxyDevice(std::unique_ptr<Stream> host, std::unique_ptr<Stream> waits,
                  StreamResources& resources, int64_t workers, std::string who,
                  std::chrono::milliseconds timeout,
                  std::optional<uint64_t> chaos_seed = std::nullopt);

  // Every operation below works on host memory, its own or (the proxies'
  // ring) another host proxy's, read in place.
  Status Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                int64_t dst_len) override;
  Status Scatter(const float* src, int64_t src_device, int64_t src_len, const LeafRun* runs,
                 int64_t num_runs) override;
  Status SumSlots(float* own, int64_t n, int64_t slots, float scale,
                  const Rows& rows = Rows{}) override {
    Stall();
    return SumSlotsOn(*host_, own, n, slots, scale, rows);
  }
  // Host loops: row by row (a host stream's work is not a launch).
  Status AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n, float scale,
                 const Rows& rows = Rows{}) override;
  Status CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                  const Rows& rows = Rows{}) override;
  Status Scale(float* x, int64_t n, float scale) override;
  Status ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  StatusOr<double> SumSquares(const float* x, int64_t n) override;
  StatusOr<Mismatch> FirstMismatch(const float* master, const LeafRun* runs, int64_t num_runs,
                                   float* scratch, int64_t scratch_device,
                                   int64_t scratch_len) override;
  Status ZeroBytes(void* dst, size_t bytes) override;
  Status CopyBytes(void* dst, const void* src, size_t bytes) override;
  Status CopyToHost(void* host, const void* own, size_t bytes) override {
    return CopyBytes(host, own, bytes);
  }
  Status CopyFromHost(void* own, const void* host, size_t bytes) override {
    return CopyBytes(own, host, bytes);
  }
  // Its work is done when it returns; its flags announce it to the workers.
  Status Publish() override { return Status::Success(); }
  Status Acquire(int64_t device) override;
  Status WaitFlag(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                  const std::string& what) override {
    return host_->WaitValue(flag, value, timeout, what);  // on this thread: done when enqueued
  }
  Status SynchronizeHost(const char*) override { return Status::Success(); }
  bool SupportsEmulation() const override { return false; }
  // Its session has no shared-memory strategy (the streams' storage offers
  // none): every device of a session takes the same path through the
  // protocol (GatherPull, PushesInPlace: phases.h).

 private:
  std::unique_ptr<Stream> host_;
  std::vector<kernels::Span> spans_;  // a pack's or unpack's (SpansOf), kept for its room
  std::unique_ptr<Stream> waits_;
  StreamResources& res_;
  int64_t workers_;
  std::string who_;
  std::chrono::milliseconds timeout_;
  PublicationsSeen acquired_;             // each worker's event waited for once per publication
  std::optional<std::mt19937_64> chaos_;  // seeded stalls (tests), or none
  void Stall();
};

}  // namespace coarse
