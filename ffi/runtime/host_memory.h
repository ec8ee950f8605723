// Host memory of the runtime's own that a device's stream must not treat as
// device memory (the session's chunks across hosts): a GPU reaches it only by
// a host-to-device or device-to-host copy (Device::CopyToHost/CopyFromHost),
// never by a device-to-device copy or memset. The stream-semantics CPU
// backend (cpu/host_stream.h) refuses a Copy or Memset that touches it, so a
// CPU run catches the mistake the CUDA backend would fail on.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace coarse {

// Registers [p, p + bytes) as host memory until ForgetHostMemory(p).
void NoteHostMemory(const void* p, size_t bytes);
void ForgetHostMemory(const void* p);
// Whether [p, p + bytes) overlaps registered host memory.
bool IsHostMemory(const void* p, size_t bytes);

// A std::vector's allocator that registers what it allocates.
template <typename T>
struct HostMemoryAllocator {
  using value_type = T;
  HostMemoryAllocator() = default;
  template <typename U>
  HostMemoryAllocator(const HostMemoryAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    T* p = std::allocator<T>().allocate(n);
    NoteHostMemory(p, n * sizeof(T));
    return p;
  }
  void deallocate(T* p, size_t n) {
    ForgetHostMemory(p);
    std::allocator<T>().deallocate(p, n);
  }
  template <typename U>
  bool operator==(const HostMemoryAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const HostMemoryAllocator<U>&) const {
    return false;
  }
};

template <typename T>
using HostVector = std::vector<T, HostMemoryAllocator<T>>;

}  // namespace coarse
