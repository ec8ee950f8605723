// CheckFlagWait (see host_stream_check.h).
#include "cpu/host_stream_check.h"

#include <chrono>
#include <thread>

#include "cpu/cpu_backend_choice.h"
#include "cpu/host_stream.h"
#include "runtime/host_memory.h"

namespace coarse {

FlagWaitResult CheckFlagWait(int64_t timeout_ms, int64_t delay_ms, bool write) {
  // Never destroyed, as every HostQueue (its thread may outlive the call).
  static HostQueue* queue = new HostQueue("flag check stream", StreamChaosSeed());
  HostStream stream(*queue);
  HostVector<uint32_t> flag(1, 0);  // pinned host memory, as a proxy's
  HostVector<float> src(1, 0.0f);
  float dst = -1.0f;
  HostEvent event;
  FlagWaitResult out;
  auto note = [&](Status e) {
    if (e.failure() && out.error.empty()) out.error = std::string(e.message());
  };
  note(stream.WaitValue(flag.data(), 7, std::chrono::milliseconds(timeout_ms), "the check's flag"));
  note(stream.UploadPinned(&dst, src.data(), sizeof(float), "the check's upload"));
  note(stream.Record(&event));
  if (write) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    src[0] = 42.0f;
    WriteFlag(flag.data(), 7);
  }
  note(stream.HostWait(&event, std::chrono::milliseconds(timeout_ms + 5000), "the check's event"));
  note(stream.Synchronize("the check"));
  out.copied = dst;
  return out;
}

}  // namespace coarse
