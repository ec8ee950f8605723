// Which device backend the CPU extension runs its sessions on, read once from
// the environment when the extension loads (module_cpu.cc):
//   COARSE_JAX_BACKEND        unset or "cpu": StreamDevice over the inline
//                             stream (inline_stream.h: one address space,
//                             every operation done when it returns, the
//                             shared-memory strategy); "streams": over
//                             threaded host streams (host_stream.h), the
//                             CUDA backend's semantics.
//   COARSE_JAX_STREAM_CHAOS   with "streams": an integer seed turns on seeded
//                             random delays and yields in the streams.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace coarse {

enum class CpuBackend { kCpu, kStreams };

// Reads both variables (the first call only; later calls return what it
// read). Throws std::invalid_argument naming the variable, the value and
// the choices when a value is not understood.
CpuBackend ChooseCpuBackend();
// The backend ChooseCpuBackend chose (kCpu before it ran).
CpuBackend ActiveCpuBackend();
const char* CpuBackendName(CpuBackend backend);
// The chaos seed, if COARSE_JAX_STREAM_CHAOS set one.
std::optional<uint64_t> StreamChaosSeed();

// What a CPU module does when it loads (module_cpu.cc, and the lab's
// module_lab_cpu.cc): chooses the backend (ChooseCpuBackend) and installs the
// host storage pool for it. A value not understood leaves the plain backend
// and is returned ("" if none), for the module's backend() to raise: an
// error raised while the module loads would reach Python as an ImportError,
// which reads as "not built".
std::string LoadCpuBackend();

}  // namespace coarse
