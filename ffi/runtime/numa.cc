// NUMA placement of host pages (see numa.h).
#include "runtime/numa.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace coarse::numa {
namespace {

// From the kernel's uapi (linux/mempolicy.h), which a libc need not ship:
// the mode, and the node mask's size we pass (nodes 0..1023).
constexpr int kMpolPreferred = 1;
constexpr int kMaskNodes = 1024;
constexpr int kMaskWords = kMaskNodes / (8 * sizeof(unsigned long));

bool AllHex(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c) != 0; });
}

// `s` as `width` hex digits: its last `width` if longer (CUDA's 8-digit
// domain), zero-padded if shorter; "" if it is not hex or drops a non-zero digit.
std::string HexField(const std::string& s, size_t width) {
  if (!AllHex(s)) return "";
  if (s.size() > width) {
    const std::string head = s.substr(0, s.size() - width);
    if (head.find_first_not_of('0') != std::string::npos) return "";
    return s.substr(s.size() - width);
  }
  return std::string(width - s.size(), '0') + s;
}

}  // namespace

std::string CanonicalPciBusId(const std::string& pci_bus_id) {
  std::string id;
  for (char c : pci_bus_id)
    if (!std::isspace(static_cast<unsigned char>(c)))
      id += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // [domain:]bus:device.function
  std::string domain = "0000", rest = id;
  const size_t colons = std::count(id.begin(), id.end(), ':');
  if (colons == 2) {
    const size_t c = id.find(':');
    domain = HexField(id.substr(0, c), 4);
    rest = id.substr(c + 1);
  } else if (colons != 1) {
    return "";
  }
  const size_t c = rest.find(':'), dot = rest.find('.');
  if (c == std::string::npos || dot == std::string::npos || dot < c) return "";
  const std::string bus = HexField(rest.substr(0, c), 2),
                    dev = HexField(rest.substr(c + 1, dot - c - 1), 2), fn = rest.substr(dot + 1);
  if (domain.empty() || bus.empty() || dev.empty() || fn.size() != 1 || fn[0] < '0' || fn[0] > '7')
    return "";
  return domain + ":" + bus + ":" + dev + "." + fn;
}

int NumaNodeOfPciBus(const std::string& pci_bus_id, const std::string& sysfs_root) {
  const std::string id = CanonicalPciBusId(pci_bus_id);
  if (id.empty()) return -1;
  // stdio, not std::ifstream: on an H200 host (torch's Python, jax 0.11.2)
  // `ifstream >> long` here crashed the process inside libstdc++'s locale
  // code the first time a GPU mesh placed a proxy in host memory. The
  // runtime reads files with stdio only.
  const std::string path = sysfs_root + "/bus/pci/devices/" + id + "/numa_node";
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  long node = -1;
  const int got = std::fscanf(f, "%ld", &node);
  std::fclose(f);
  if (got != 1 || node < 0 || node >= kMaskNodes) return -1;
  return static_cast<int>(node);
}

int NumaNodeCount(const std::string& sysfs_root) {
  const std::string dir = sysfs_root + "/devices/system/node";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 1;
  int count = 0;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= 4 || name.compare(0, 4, "node") != 0) continue;
    if (!std::all_of(name.begin() + 4, name.end(),
                     [](unsigned char c) { return std::isdigit(c) != 0; }))
      continue;
    struct stat st;
    if (stat((dir + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) ++count;
  }
  closedir(d);
  return std::max(1, count);
}

HostPages::~HostPages() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

HostPages::HostPages(HostPages&& other) noexcept { *this = std::move(other); }

HostPages& HostPages::operator=(HostPages&& other) noexcept {
  if (this == &other) return *this;
  if (data_ != nullptr) munmap(data_, bytes_);
  data_ = std::exchange(other.data_, nullptr);
  bytes_ = std::exchange(other.bytes_, 0);
  node_ = std::exchange(other.node_, -1);
  bound_ = std::exchange(other.bound_, false);
  why_ = std::move(other.why_);
  return *this;
}

std::string HostPages::Describe() const {
  const std::string s = std::to_string(bytes_) + " bytes, ";
  if (node_ < 0) return s + "no node requested";
  return s + "node " + std::to_string(node_) + " requested" +
         (bound_ ? ", bound (preferred)" : ", not bound: " + why_);
}

HostPages AllocateOnNodes(size_t bytes, int node, int node_count) {
  HostPages out;
  const size_t page = static_cast<size_t>(std::max<long>(4096, sysconf(_SC_PAGESIZE)));
  const size_t mapped = std::max<size_t>(1, (bytes + page - 1) / page) * page;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return out;
  out.data_ = base;
  out.bytes_ = mapped;
  out.node_ = node < 0 ? -1 : node;
  if (node < 0) {
    out.why_ = "no node requested";
  } else if (node_count <= 1) {
    out.why_ = "one node";  // nothing to choose: binding would only cost a syscall
  } else if (node >= kMaskNodes) {
    out.why_ = "node out of range";
  } else {
    // Before the first touch: the policy places the pages when they are
    // faulted in (by the memset of a caller or cudaHostRegister's pinning).
    unsigned long mask[kMaskWords] = {};
    mask[node / (8 * sizeof(unsigned long))] = 1ul << (node % (8 * sizeof(unsigned long)));
    // maxnode is one more than the mask's bits: the kernel reads maxnode - 1.
    if (syscall(SYS_mbind, base, mapped, kMpolPreferred, mask,
                static_cast<unsigned long>(kMaskNodes + 1), 0u) == 0) {
      out.bound_ = true;
    } else {
      // EPERM (a container's seccomp), ENOSYS (no NUMA in the kernel),
      // EINVAL (a node that is not online): the memory works unbound.
      out.why_ = std::string("mbind: ") + std::strerror(errno);
    }
  }
  return out;
}

HostPages Allocate(size_t bytes, int node) {
  static const int nodes = NumaNodeCount();  // the machine's: read once
  return AllocateOnNodes(bytes, node, nodes);
}

}  // namespace coarse::numa
