// ChooseCpuBackend, the chaos seed and LoadCpuBackend (see cpu_backend_choice.h).
#include "cpu/cpu_backend_choice.h"

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cpu/cpu_storage.h"

namespace coarse {

namespace {

struct Choice {
  CpuBackend backend = CpuBackend::kCpu;
  std::optional<uint64_t> seed;
};

Choice& TheChoice() {
  static Choice choice;
  return choice;
}

Choice Read() {
  Choice c;
  const char* name = std::getenv("COARSE_JAX_BACKEND");
  const std::string value = name == nullptr ? "" : name;
  if (value.empty() || value == "cpu") {
    c.backend = CpuBackend::kCpu;
  } else if (value == "streams") {
    c.backend = CpuBackend::kStreams;
  } else {
    throw std::invalid_argument(
        "coarse_jax: environment variable COARSE_JAX_BACKEND is '" + value +
        "'; expected 'cpu' (the default: every operation done when it returns) or 'streams' "
        "(device streams with GPU semantics). Unset it or set one of those.");
  }
  const char* chaos = std::getenv("COARSE_JAX_STREAM_CHAOS");
  if (chaos != nullptr && *chaos != '\0') {
    char* end = nullptr;
    const unsigned long long seed = std::strtoull(chaos, &end, 10);
    if (end == nullptr || *end != '\0' || *chaos == '-')
      throw std::invalid_argument(
          std::string("coarse_jax: environment variable COARSE_JAX_STREAM_CHAOS is '") + chaos +
          "'; expected a non-negative integer seed (the random delays and yields of the "
          "streams backend). Unset it to run without them.");
    c.seed = seed;
  }
  return c;
}

}  // namespace

CpuBackend ChooseCpuBackend() {
  static std::once_flag once;
  std::call_once(once, [] { TheChoice() = Read(); });
  return TheChoice().backend;
}

CpuBackend ActiveCpuBackend() { return TheChoice().backend; }

const char* CpuBackendName(CpuBackend backend) {
  return backend == CpuBackend::kStreams ? "streams" : "cpu";
}

std::optional<uint64_t> StreamChaosSeed() { return TheChoice().seed; }

std::string LoadCpuBackend() {
  CpuBackend backend = CpuBackend::kCpu;
  std::string error;
  try {
    backend = ChooseCpuBackend();
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  InstallHostStoragePool(backend == CpuBackend::kStreams);
  return error;
}

}  // namespace coarse
