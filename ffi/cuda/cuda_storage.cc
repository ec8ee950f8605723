// CudaStorage and the GPU storage pool the CUDA module installs (see
// cuda_storage.h).
#include "cuda/cuda_storage.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/host_memory.h"
#include "runtime/numa.h"

namespace coarse::cuda {

namespace {

// Switches the calling thread to `ordinal` and back: XLA's thread keeps its
// own device current.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    cudaGetDevice(&saved_);
    ok_ = cudaSetDevice(ordinal) == cudaSuccess;
    if (!ok_) cudaGetLastError();  // leave no error behind for the next launch check
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  bool ok() const { return ok_; }

 private:
  int saved_ = 0;
  bool ok_ = false;
};

// The NUMA node of the GPU with `ordinal` (its PCI device's, from sysfs); -1
// for no GPU or where the kernel does not say.
int NumaNodeOfGpu(int64_t ordinal) {
  if (IsHostOrdinal(ordinal)) return -1;
  char bus[64] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), static_cast<int>(ordinal)) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return numa::NumaNodeOfPciBus(bus);
}

// Whether every GPU reaches registered host memory at its host address. The
// kernels, copies and flag waits are given host addresses, which is what
// cudaHostAlloc's mapped memory promises under UVA; for cudaHostRegister's
// it holds only where this attribute says so (else the device address
// differs: cudaHostGetDevicePointer).
bool RegisteredMemoryAtHostAddress() {
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    for (int d = 0; d < n; ++d) {
      int v = 0;
      if (cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, d) !=
              cudaSuccess ||
          v == 0) {
        cudaGetLastError();
        return false;
      }
    }
    return true;
  }();
  return ok;
}

}  // namespace

// Page-aligned host memory for a proxy in host memory, on the NUMA node of
// the workers it serves (runtime/numa.h: preferred, or unbound where the
// machine has one node or mbind is refused), then pinned and mapped for
// every GPU: cudaHostRegister with portable | mapped, the flags the
// cudaHostAlloc it replaces used. cudaHostAlloc cannot choose a node: it
// places the pages wherever the calling thread runs. Zeroed.
class PinnedPages {
 public:
  // `gpus`: the GPUs whose work may touch the pages (waited for before they
  // are unpinned).
  explicit PinnedPages(std::vector<int> gpus) : gpus_(std::move(gpus)) {}
  ~PinnedPages() {
    if (data_ == nullptr) return;
    if (registered_) {
      // The documentation does not say that cudaHostUnregister waits for the
      // GPUs' copies from these pages, and munmap (pages_) must not take
      // them from under one: wait for the GPUs first. This runs when a pool
      // evicts a set or a store is dropped (as the cudaFree that waits for
      // the GPU does), never per step.
      for (int g : gpus_) {
        DeviceScope scope(g);
        if (scope.ok() && cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
      }
      if (cudaHostUnregister(data_) != cudaSuccess) cudaGetLastError();
    } else {
      cudaFreeHost(data_);
    }
  }
  PinnedPages(const PinnedPages&) = delete;
  PinnedPages& operator=(const PinnedPages&) = delete;

  // "" on success, else what failed.
  std::string Allocate(size_t bytes, int node) {
    if (RegisteredMemoryAtHostAddress()) {
      pages_ = numa::Allocate(bytes, node);
      if (pages_.data() == nullptr) return "mmap of " + std::to_string(bytes) + " bytes failed";
      const cudaError_t err = cudaHostRegister(pages_.data(), pages_.bytes(),
                                               cudaHostRegisterPortable | cudaHostRegisterMapped);
      if (err == cudaSuccess) {
        data_ = pages_.data();
        registered_ = true;
        return "";
      }
      cudaGetLastError();
      pages_ = numa::HostPages();  // unmapped: cudaHostAlloc below, as before
    }
    // A GPU that cannot use a registered page at its host address, or pages
    // the driver would not pin: cudaHostAlloc's, on no node in particular.
    const cudaError_t err =
        cudaHostAlloc(&data_, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) {
      cudaGetLastError();
      data_ = nullptr;
      return std::string("cudaHostAlloc: ") + cudaGetErrorString(err);
    }
    std::memset(data_, 0, bytes);  // as the fresh pages of the mapping
    return "";
  }
  void* data() const { return data_; }

 private:
  std::vector<int> gpus_;
  numa::HostPages pages_;
  void* data_ = nullptr;
  bool registered_ = false;
};

namespace {

// The GPUs of a mesh (`ordinals` without its proxies in host memory).
std::vector<int> GpusOf(const std::vector<int64_t>& ordinals) {
  std::vector<int> gpus;
  for (int64_t o : ordinals)
    if (!IsHostOrdinal(o)) gpus.push_back(static_cast<int>(o));
  return gpus;
}

}  // namespace

CudaStorage::CudaStorage(const Plan& plan, const std::vector<int64_t>& ordinals)
    : ordinals_(ordinals) {
  const int64_t p = plan.workers, q = plan.proxies, devices = plan.devices();
  if (static_cast<int64_t>(ordinals_.size()) != devices) {
    error_ =
        "coarse_jax: the CUDA runtime needs the mesh's device ordinals (attribute "
        "'ordinals'), got " +
        std::to_string(ordinals_.size()) + " for " + std::to_string(devices) + " devices";
    return;
  }
  EnablePeerAccess();
  published_ = std::make_unique<std::atomic<uint64_t>[]>(devices);
  tables_ = std::make_unique<SpanTables[]>(devices);
  const StagingSizes sizes = StagingSizesOf(plan);
  staging_len_ = sizes.staging_len;
  max_runs_ = sizes.max_runs;
  // A proxy in host memory (IsHostOrdinal): its arena and its ready flags in
  // pinned host memory, mapped for the workers' streams (the flags'
  // cuStreamWaitValue32), and nothing on a GPU: it runs on the host
  // (runtime/host_proxy_device.h).
  const int64_t S = std::max<int64_t>(1, plan.num_pieces());
  for (int64_t k = 0; k < q; ++k) {
    const size_t arena_bytes = std::max<int64_t>(1, plan.arena_nelems[k]) * sizeof(float);
    const bool host = in_host_memory(p + k);
    // Proxy k's arena on the node of the first worker of its group (a k:1
    // proxy's workers may sit on several nodes: the first one's is taken).
    arenas_.push_back(static_cast<float*>(
        host ? PinnedAlloc(arena_bytes, ordinals_[plan.group_leader(k)], "host proxy arena")
             : Alloc(p + k, arena_bytes, "proxy arena")));
    // The flags stay cudaHostAlloc's: a page or so, read by the workers'
    // stream waits, where placement hardly matters.
    flags_.push_back(host ? static_cast<uint32_t*>(HostAlloc(S * sizeof(uint32_t), "ready flags"))
                          : nullptr);
  }
  for (int64_t w = 0; w < p; ++w)
    scratch_.push_back(static_cast<float*>(
        Alloc(w, std::max<int64_t>(1, plan.leading_nelems) * sizeof(float), "worker scratch")));
  const bool host_proxy = HasHostProxy(plan, *this);
  for (int64_t d = 0; d < devices; ++d) {
    if (in_host_memory(d)) {  // no stream of its own: no staging, span table, scalars, event
      staging_.push_back(nullptr);
      spans_.push_back(nullptr);
      scalars_.push_back(nullptr);
      events_.push_back(nullptr);
      continue;
    }
    // A worker's, with a proxy in host memory: its pushes' copy ring (CopyMarks).
    const int64_t len = host_proxy && d < p ? CopyRing(staging_len_) : staging_len_;
    staging_.push_back(static_cast<float*>(Alloc(d, (len + 4) * sizeof(float), "staging")));
    spans_.push_back(static_cast<kernels::Span*>(
        Alloc(d, kSpanTables * max_runs_ * sizeof(kernels::Span), "span tables")));
    scalars_.push_back(
        static_cast<double*>(Alloc(d, StreamResources::kScalarSlots * sizeof(double), "scalars")));
    events_.push_back(NewEvent(d));
  }
  // A worker's copy streams' marks (StreamDevice: copies down to a proxy in
  // host memory and up from it), after the devices' events so events_[d]
  // stays device d's.
  // With a proxy in host memory, each worker's pulls get a copy ring of
  // their own (CopyMarks::up_staging), after the devices' staging so
  // staging_[d] stays device d's.
  kept_ = std::make_unique<KeptDevice[]>(p);
  for (int64_t w = 0; w < p; ++w) {
    for (int i = 0; i < 4; ++i) events_.push_back(NewEvent(w));
    const size_t e = events_.size() - 4;
    marks_.push_back(CopyMarks{events_[e], events_[e + 1], events_[e + 2], events_[e + 3]});
    if (host_proxy)
      marks_.back().up_staging = staging_.emplace_back(static_cast<float*>(
          Alloc(w, (CopyRing(staging_len_) + 4) * sizeof(float), "pull staging")));
  }
}

cudaEvent_t CudaStorage::NewEvent(int64_t device) {
  cudaEvent_t ev = nullptr;
  DeviceScope scope(ordinal(device));
  if (error_.empty() && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    error_ = "coarse_jax: cudaEventCreate failed on GPU " + std::to_string(ordinal(device));
  }
  return ev;
}

void* CudaStorage::HostAlloc(size_t bytes, const char* what) {
  if (!error_.empty()) return nullptr;
  // Page-aligned, pinned for every GPU (portable), mapped into their address
  // space; zeroed, so the flags start below every session's value.
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
    error_ = "coarse_jax: cudaHostAlloc of " + std::to_string(bytes) + " bytes (" + what +
             ") failed: " + cudaGetErrorString(err);
    return nullptr;
  }
  std::memset(ptr, 0, bytes);
  NoteHostMemory(ptr, bytes);
  host_allocations_.push_back(ptr);
  bytes_ += static_cast<int64_t>(bytes);
  return ptr;
}

void* CudaStorage::PinnedAlloc(size_t bytes, int64_t ordinal, const char* what) {
  if (!error_.empty()) return nullptr;
  auto pages = std::make_unique<PinnedPages>(GpusOf(ordinals_));
  const std::string failed = pages->Allocate(bytes, NumaNodeOfGpu(ordinal));
  if (!failed.empty()) {
    error_ = "coarse_jax: pinning " + std::to_string(bytes) + " bytes of host memory (" + what +
             ") failed: " + failed;
    return nullptr;
  }
  void* ptr = pages->data();
  NoteHostMemory(ptr, bytes);
  pinned_.push_back(std::move(pages));
  bytes_ += static_cast<int64_t>(bytes);
  return ptr;
}

void CudaStorage::EnablePeerAccess() {
  // Lets cudaMemcpyPeerAsync go GPU to GPU (NVLink / PCIe P2P) instead of
  // through host memory. A context-wide switch, set once per pair; where the
  // hardware cannot, peer copies still work, staged by the driver.
  for (int64_t a : ordinals_)
    for (int64_t b : ordinals_) {
      if (a == b || IsHostOrdinal(a) || IsHostOrdinal(b)) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, static_cast<int>(a), static_cast<int>(b)) != cudaSuccess ||
          !can)
        continue;
      DeviceScope scope(static_cast<int>(a));
      if (cudaDeviceEnablePeerAccess(static_cast<int>(b), 0) != cudaSuccess)
        cudaGetLastError();  // already enabled (by XLA or an earlier plan): clear it
    }
}

void* CudaStorage::Alloc(int64_t device, size_t bytes, const char* what) {
  if (!error_.empty()) return nullptr;
  DeviceScope scope(ordinal(device));
  if (!scope.ok()) {
    error_ = "coarse_jax: the mesh places a device on GPU " + std::to_string(ordinal(device)) +
             ", which this process cannot use (cudaSetDevice failed; check the mesh and "
             "CUDA_VISIBLE_DEVICES)";
    return nullptr;
  }
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for XLA
    error_ = "coarse_jax: cudaMalloc of " + std::to_string(bytes) + " bytes (" + what +
             ") on GPU " + std::to_string(ordinal(device)) + " failed: " + cudaGetErrorString(err) +
             ". JAX preallocates 75% of each GPU; leave room with "
             "XLA_PYTHON_CLIENT_MEM_FRACTION=.6 (or XLA_PYTHON_CLIENT_PREALLOCATE=false).";
    return nullptr;
  }
  allocations_.emplace_back(ordinal(device), ptr);
  bytes_ += static_cast<int64_t>(bytes);
  return ptr;
}

CudaStorage::~CudaStorage() {
  // cudaFree waits for the device: this runs only when the pool evicts a set
  // (or on a failed allocation), never per step.
  for (auto& [ord, ptr] : allocations_) {
    DeviceScope scope(ord);
    cudaFree(ptr);
  }
  for (size_t d = 0; d < events_.size(); ++d)
    if (events_[d] != nullptr) cudaEventDestroy(events_[d]);
  for (void* ptr : host_allocations_) {
    ForgetHostMemory(ptr);
    cudaFreeHost(ptr);  // waits for the GPUs' copies from it, as cudaFree
  }
  for (auto& pages : pinned_) ForgetHostMemory(pages->data());
  pinned_.clear();  // waits for the GPUs, then unpins and unmaps (PinnedPages)
}

namespace {

// Spare sets per (plan, ordinals) in a SpareSets (runtime/storage.h), at
// most kMaxSetsPerPlan of each: steps of one plan overlap by at most about
// one on the GPU (async dispatch), so two sets cover the steady state.
// Optimizer state on one GPU (runtime/param_store.h).
class CudaStateBuffer final : public StateBuffer {
 public:
  CudaStateBuffer(int ordinal, int64_t nelems) : ordinal_(ordinal), nelems_(nelems) {}
  ~CudaStateBuffer() override {
    if (data_ == nullptr) return;
    DeviceScope scope(ordinal_);
    cudaFree(data_);
  }
  bool Allocate() {
    DeviceScope scope(ordinal_);
    if (cudaMalloc(reinterpret_cast<void**>(&data_), Bytes()) == cudaSuccess) return true;
    cudaGetLastError();
    data_ = nullptr;
    return false;
  }
  float* data() override { return data_; }
  int64_t nelems() const override { return nelems_; }
  bool ToHost(float* dst, int64_t off, int64_t n) override {
    DeviceScope scope(ordinal_);
    return cudaMemcpy(dst, data_ + off, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  bool FromHost(const float* src, int64_t off, int64_t n) override {
    DeviceScope scope(ordinal_);
    return cudaMemcpy(data_ + off, src, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  bool CopyWithin(StateBuffer& src, int64_t src_off, int64_t dst_off, int64_t n) override {
    DeviceScope scope(ordinal_);
    return cudaMemcpy(data_ + dst_off, src.data() + src_off, n * sizeof(float),
                      cudaMemcpyDeviceToDevice) == cudaSuccess;
  }

 private:
  size_t Bytes() const { return static_cast<size_t>(nelems_) * sizeof(float); }
  int ordinal_;
  int64_t nelems_;
  float* data_ = nullptr;
};

// A proxy in host memory's master weights and optimizer state: pinned host
// memory (its optimizer runs on the host), mapped for the workers' streams
// (worker k seeds and checks it, ParamStore).
class PinnedStateBuffer final : public HostAddressedStateBuffer {
 public:
  PinnedStateBuffer(int64_t nelems, std::vector<int> gpus)
      : nelems_(nelems), pages_(std::move(gpus)) {}
  ~PinnedStateBuffer() override {
    if (data_ != nullptr) ForgetHostMemory(data_);
  }  // then pages_ waits for the GPUs, unpins and unmaps
  // On the NUMA node of GPU `node_of`.
  bool Allocate(int64_t node_of) {
    if (!pages_.Allocate(Bytes(), NumaNodeOfGpu(node_of)).empty()) return false;
    data_ = static_cast<float*>(pages_.data());
    NoteHostMemory(data_, Bytes());
    return true;
  }
  float* data() override { return data_; }
  int64_t nelems() const override { return nelems_; }

 private:
  size_t Bytes() const {
    return static_cast<size_t>(std::max<int64_t>(1, nelems_)) * sizeof(float);
  }
  int64_t nelems_;
  PinnedPages pages_;
  float* data_ = nullptr;
};

// The GPU of the first worker proxy `device` serves, for a proxy in host
// memory: the ordinals are the p workers' GPUs, then -1 - k for proxy k at
// mesh device p + k (runtime/storage.h), and proxy k serves workers
// k*g .. k*g + g - 1 with g = p / q (Plan::group_leader). Where a k:1
// proxy's workers sit on several NUMA nodes the first worker's node is
// taken: it seeds and snapshots the store, and there is one node to choose.
// -1 (no node) if the ordinals do not have that shape.
int64_t FirstServedGpu(const std::vector<int64_t>& ordinals, int64_t device) {
  const int64_t k = HostProxyOfOrdinal(ordinals[device]), p = device - k;
  const int64_t q = static_cast<int64_t>(ordinals.size()) - p;
  if (k < 0 || p <= 0 || q <= 0 || p % q != 0) return -1;
  return ordinals[k * (p / q)];
}

class CudaPool final : public StoragePool {
 public:
  std::unique_ptr<StateBuffer> NewStateBuffer(const std::vector<int64_t>& ordinals, int64_t device,
                                              int64_t nelems) override {
    if (device >= static_cast<int64_t>(ordinals.size())) return nullptr;
    if (IsHostOrdinal(ordinals[device])) {
      auto b = std::make_unique<PinnedStateBuffer>(nelems, GpusOf(ordinals));
      if (!b->Allocate(FirstServedGpu(ordinals, device))) return nullptr;
      return b;
    }
    auto b = std::make_unique<CudaStateBuffer>(static_cast<int>(ordinals[device]), nelems);
    if (!b->Allocate()) return nullptr;
    return b;
  }

  std::unique_ptr<Storage> Take(const Plan& plan, const std::vector<int64_t>& ordinals) override {
    if (auto set = spares_.Take(plan.key, ordinals)) return set;
    return std::make_unique<CudaStorage>(plan, ordinals);
  }

  void Give(const Plan& plan, const std::vector<int64_t>& ordinals,
            std::unique_ptr<Storage> set) override {
    if (!static_cast<CudaStorage&>(*set).error().empty()) return;  // never reuse a failed set
    spares_.Give(plan.key, ordinals, std::move(set));
  }

  SpareSets& spares() override { return spares_; }

 private:
  SpareSets spares_;
};

}  // namespace

void InstallCudaStoragePool() {
  static CudaPool* pool = new CudaPool;  // lives for the process
  SetStoragePool(pool);
}

}  // namespace coarse::cuda
