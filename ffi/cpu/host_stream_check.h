// Testing: the host streams' flag wait and host wait on their own, outside a
// session (tests/test_streams_backend.py), so that a pull's wait that never
// ends is seen to give up and name what it waited for.
#pragma once

#include <cstdint>
#include <string>

namespace coarse {

struct FlagWaitResult {
  std::string error;  // the stream's error, "" if none
  float copied = 0;   // what the upload after the wait copied
};

// On a fresh host stream: WaitValue(flag, 7, timeout_ms, "the check's flag"),
// an UploadPinned of one float after it, an event; then, if `write`, the
// host writes the float (42) and the flag after `delay_ms`; the host waits
// for the event (HostWait) and the stream (Synchronize).
FlagWaitResult CheckFlagWait(int64_t timeout_ms, int64_t delay_ms, bool write);

}  // namespace coarse
