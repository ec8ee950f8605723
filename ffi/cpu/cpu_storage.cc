// The host-memory storage pool, which the CPU module installs as its
// storage pool (runtime/storage.h) when it loads.
//
// Spare sets are kept in a SpareSets (runtime/storage.h): those of the few
// most recently used plans, within a byte limit, so a process that ran many
// plans (a benchmark suite, a sweep) does not keep them all; the most recent
// plan's sets are always kept, whatever their size, so a single large plan
// still reuses its storage.
#include "cpu/cpu_storage.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <memory>
#include <new>
#include <vector>

#include "cpu/host_stream.h"
#include "cpu/shared_memory_sums.h"
#include "runtime/host_memory.h"
#include "runtime/numa.h"
#include "runtime/storage.h"
#include "runtime/stream.h"

namespace coarse {
namespace {

// One set's buffers in one anonymous mapping (runtime/numa.h's HostPages),
// each starting on its own page.
// Not malloc: the sessions of a step are created (and freed) by whichever of
// XLA's threads gets there first, and glibc keeps memory freed on a thread's
// arena for later use rather than return it to the system, so a process that
// ran many plans kept a few hundred MB it no longer used (200 plans of 1 MiB
// per worker on 4 workers: RSS 370 -> 540-670 MB, all of it given back by
// malloc_trim). munmap gives a freed set back at once.
class HostStorage : public Storage {
 public:
  explicit HostStorage(const Plan& plan) {
    const int64_t page = std::max<int64_t>(4096, sysconf(_SC_PAGESIZE));
    auto round_up = [page](int64_t bytes) { return (bytes + page - 1) / page * page; };
    std::vector<int64_t> arena_off, scratch_off;
    for (int64_t k = 0; k < plan.proxies; ++k) {
      const int64_t arena = std::max<int64_t>(1, plan.arena_nelems[k]);
      arena_off.push_back(mapped_);
      mapped_ += round_up(arena * static_cast<int64_t>(sizeof(float)));
      bytes_ += arena * static_cast<int64_t>(sizeof(float));
    }
    for (int64_t w = 0; w < plan.workers; ++w) {
      const int64_t scratch = std::max<int64_t>(1, plan.leading_nelems);
      scratch_off.push_back(mapped_);
      mapped_ += round_up(scratch * static_cast<int64_t>(sizeof(float)));
      bytes_ += scratch * static_cast<int64_t>(sizeof(float));
    }
    // Node -1: a CPU worker is a virtual device with no PCI bus, so there is
    // no node to prefer (runtime/numa.h); these are plain pages.
    pages_ = numa::Allocate(static_cast<size_t>(mapped_), -1);
    if (pages_.data() == nullptr) throw std::bad_alloc();
    base_ = static_cast<char*>(pages_.data());
    for (int64_t k = 0; k < plan.proxies; ++k)
      arenas_.push_back(reinterpret_cast<float*>(base_ + arena_off[k]));
    for (int64_t w = 0; w < plan.workers; ++w)
      scratch_.push_back(reinterpret_cast<float*>(base_ + scratch_off[w]));
  }
  HostStorage(const HostStorage&) = delete;
  HostStorage& operator=(const HostStorage&) = delete;

  float* arena(int64_t proxy) override { return arenas_[proxy]; }
  float* scratch(int64_t worker) override { return scratch_[worker]; }
  int64_t bytes() const override { return bytes_; }

 private:
  numa::HostPages pages_;  // unmapped when the set is freed
  char* base_ = nullptr;
  int64_t mapped_ = 0;  // bytes mapped (page-rounded)
  int64_t bytes_ = 0;   // bytes the plan asks for
  std::vector<float*> arenas_, scratch_;
};

// A mapping too (see HostStorage): master weights and optimizer state can be
// gigabytes, and a freed store should go back to the system at once.
class HostStateBuffer : public HostAddressedStateBuffer {
 public:
  HostStateBuffer(int64_t nelems, bool streams)
      : nelems_(std::max<int64_t>(1, nelems)),
        streams_(streams),
        pages_(numa::Allocate(static_cast<size_t>(nelems_) * sizeof(float), -1)) {
    if (pages_.data() == nullptr) throw std::bad_alloc();
    data_ = static_cast<float*>(pages_.data());
  }
  // Before pages_ is unmapped.
  ~HostStateBuffer() override {
    if (streams_) DrainAllHostQueues();  // a proxy's stream may still write it
  }
  HostStateBuffer(const HostStateBuffer&) = delete;
  HostStateBuffer& operator=(const HostStateBuffer&) = delete;

  float* data() override { return data_; }
  int64_t nelems() const override { return nelems_; }

 private:
  int64_t nelems_;
  bool streams_;
  // As HostStorage's, on no node in particular (the CUDA pool's twin,
  // cuda_storage.cc, places a proxy's on its workers' node).
  numa::HostPages pages_;
  float* data_ = nullptr;
};

// A HostStorage plus the StreamResources of the CPU platform's streams,
// in one of two modes, chosen with the backend:
//  * shared (the default backend, on the inline stream): one address space.
//    Every device's kernels address every other's memory (shares_memory),
//    so nothing is staged or copied (staging is a token one float), a proxy
//    "in host memory" is one like any other (the CPU's memory is host
//    memory), and the session's shared-memory strategy is offered
//    (cpu/shared_memory_sums.h: the one-pass sums, in-place pulls).
//  * streams (COARSE_JAX_BACKEND=streams): what a GPU machine is. A device
//    reaches a peer only by copies (one jax device at two places of the mesh
//    excepted: testing.shared_device_mesh), and a proxy in host memory has
//    the runtime's registered host memory as its arena (page aligned, as
//    cudaHostAlloc's; a device Copy or Memset there is refused,
//    runtime/host_memory.h), reached by the workers' Download /
//    UploadPinned, with a page of ready flags (Storage::ready_flags).
// Each device's extras are their own allocation; the arenas and scratch stay
// one mapping.
class HostStreamStorage final : public Storage, public StreamResources {
 public:
  HostStreamStorage(const Plan& plan, const std::vector<int64_t>& ordinals, bool shared)
      : base_(plan), shared_(shared) {
    const StagingSizes sizes = StagingSizesOf(plan);
    staging_len_ = shared ? 1 : sizes.staging_len;
    max_runs_ = sizes.max_runs;
    for (int64_t d = 0; d < plan.devices(); ++d) {
      on_host_.push_back(!shared && d < static_cast<int64_t>(ordinals.size()) &&
                         d >= plan.workers && IsHostOrdinal(ordinals[d]));
      ordinals_.push_back(d < static_cast<int64_t>(ordinals.size()) ? ordinals[d] : d);
    }
    // A worker of a session with a proxy in host memory: its pushes' copy
    // ring in its staging, and its pulls' (CopyMarks).
    const bool host_proxy = HasHostProxy(plan, *this);
    const int64_t ring = CopyRing(staging_len_) + 4;
    for (int64_t d = 0; d < plan.devices(); ++d) {
      const bool rings = host_proxy && d < plan.workers;
      staging_.emplace_back(new float[rings ? ring : staging_len_ + 4]());
      spans_.emplace_back(new kernels::Span[kSpanTables * max_runs_]());
      scalars_.emplace_back(new double[kScalarSlots]());
      events_.emplace_back(new HostEvent);
    }
    published_ = std::make_unique<std::atomic<uint64_t>[]>(plan.devices());
    tables_ = std::make_unique<SpanTables[]>(plan.devices());
    kept_ = std::make_unique<KeptDevice[]>(plan.workers);
    for (int64_t w = 0; w < plan.workers; ++w) {
      HostEvent* e = copy_events_.emplace_back(new HostEvent[4]).get();
      marks_.push_back(CopyMarks{&e[0], &e[1], &e[2], &e[3]});
      if (host_proxy) marks_.back().up_staging = staging_.emplace_back(new float[ring]()).get();
    }
    const int64_t S = std::max<int64_t>(1, plan.num_pieces());
    for (int64_t k = 0; k < plan.proxies; ++k) {
      flags_.push_back(nullptr);
      if (!on_host_[plan.workers + k]) continue;
      NoteHostMemory(arena(k), std::max<int64_t>(1, plan.arena_nelems[k]) * sizeof(float));
      noted_.push_back(arena(k));
      flag_pages_.emplace_back(S);
      flags_.back() = flag_pages_.back().data();
    }
  }
  // Work queued on a stream may still read or write this set.
  ~HostStreamStorage() override {
    if (!shared_) DrainAllHostQueues();
    for (const void* p : noted_) ForgetHostMemory(p);
  }

  float* arena(int64_t proxy) override { return base_.arena(proxy); }
  float* scratch(int64_t worker) override { return base_.scratch(worker); }
  int64_t bytes() const override { return base_.bytes(); }
  SharedMemory* shared_memory() const override {
    return shared_ ? &TheHostSharedMemory() : nullptr;
  }
  uint32_t* ready_flags(int64_t proxy) override { return flags_[proxy]; }

  float* staging(int64_t device) override { return staging_[device].get(); }
  int64_t staging_len() const override { return staging_len_; }
  kernels::Span* spans(int64_t device) override { return spans_[device].get(); }
  SpanTables& span_tables(int64_t device) override { return tables_[device]; }
  int64_t max_runs() const override { return max_runs_; }
  double* scalars(int64_t device) override { return scalars_[device].get(); }
  StreamEvent event(int64_t device) override { return events_[device].get(); }
  bool in_host_memory(int64_t device) const override { return on_host_[device]; }
  // Shared: all of them. Else one jax device at two places of the mesh
  // (testing.shared_device_mesh): what one GPU is on a GPU machine.
  bool shares_memory(int64_t a, int64_t b) const override {
    return shared_ || a == b || (!on_host_[a] && !on_host_[b] && ordinals_[a] == ordinals_[b]);
  }
  std::atomic<uint64_t>& published(int64_t device) override { return published_[device]; }
  CopyMarks* copy_marks(int64_t device) override {
    return device < static_cast<int64_t>(marks_.size()) ? &marks_[device] : nullptr;
  }
  KeptDevice* kept_device(int64_t device) override {
    return device < static_cast<int64_t>(marks_.size()) ? &kept_[device] : nullptr;
  }

 private:
  HostStorage base_;
  bool shared_;
  std::vector<int64_t> ordinals_;
  std::unique_ptr<std::atomic<uint64_t>[]> published_;
  int64_t staging_len_ = 1, max_runs_ = 1;
  std::vector<std::unique_ptr<float[]>> staging_;  // per device; then the workers' up_staging
  std::vector<std::unique_ptr<kernels::Span[]>> spans_;
  std::unique_ptr<SpanTables[]> tables_;  // per device
  std::vector<std::unique_ptr<double[]>> scalars_;
  std::vector<std::unique_ptr<HostEvent>> events_;
  std::vector<std::unique_ptr<HostEvent[]>> copy_events_;  // per worker: CopyMarks' four
  std::vector<CopyMarks> marks_;                           // per worker
  std::vector<bool> on_host_;
  std::vector<const void*> noted_;  // the host proxies' arenas, registered
  // The flags: registered host memory too (a list: its elements never move).
  std::list<HostVector<uint32_t>> flag_pages_;
  std::vector<uint32_t*> flags_;
  // Per worker; last, so a kept device (its streams) goes before the rest.
  std::unique_ptr<KeptDevice[]> kept_;
};

class HostPool : public StoragePool {
 public:
  explicit HostPool(bool streams) : streams_(streams) {}

  std::unique_ptr<StateBuffer> NewStateBuffer(const std::vector<int64_t>&, int64_t,
                                              int64_t nelems) override {
    try {
      return std::make_unique<HostStateBuffer>(nelems, streams_);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }

  std::unique_ptr<Storage> Take(const Plan& plan, const std::vector<int64_t>& ordinals) override {
    // Streams: host proxies' sets differ from device proxies' (registered
    // arenas, flags), so the ordinals are part of the key.
    if (auto set = spares_.Take(plan.key, streams_ ? ordinals : std::vector<int64_t>{})) return set;
    return std::make_unique<HostStreamStorage>(plan, ordinals, /*shared=*/!streams_);
  }

  // Two sets of one plan may be spare at once: the next step's session can
  // be created while the last thread of the previous one still releases.
  void Give(const Plan& plan, const std::vector<int64_t>& ordinals,
            std::unique_ptr<Storage> set) override {
    spares_.Give(plan.key, streams_ ? ordinals : std::vector<int64_t>{}, std::move(set));
  }

  SpareSets& spares() override { return spares_; }

 private:
  bool streams_;
  SpareSets spares_;
};

}  // namespace

void InstallHostStoragePool(bool streams) {
  static StoragePool* host = new HostPool(streams);
  SetStoragePool(host);
}

}  // namespace coarse
