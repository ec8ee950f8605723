// Where a proxy in host memory keeps its storage on a machine with several
// NUMA nodes: on the node of the workers it serves, so that their copies to
// and from it (a GPU's DMA through its root complex) and the proxy's own
// sums do not cross the sockets' interconnect.
//
// No libnuma: the node of a PCI device is a sysfs file, the count of nodes a
// sysfs directory, and the binding one mbind system call. Everything here
// degrades to plain page-aligned memory: on one node, for a device whose
// node the kernel does not know, or where mbind is refused (a container
// without the permission, a kernel without NUMA), the memory is simply not
// bound, and HostPages says why.
#pragma once

#include <cstddef>
#include <string>

namespace coarse::numa {

// "0000:3b:00.0" for any of "0000:3B:00.0", "00000000:3B:00.0" (CUDA's and
// nvidia-smi's spellings), "3b:00.0" (no domain); "" if it is not one.
std::string CanonicalPciBusId(const std::string& pci_bus_id);

// The NUMA node of the PCI device `pci_bus_id`, read from
// <sysfs_root>/bus/pci/devices/<canonical id>/numa_node; -1 where that file
// is missing, unreadable, or says -1 (the kernel does not know).
int NumaNodeOfPciBus(const std::string& pci_bus_id, const std::string& sysfs_root = "/sys");

// How many node<N> directories <sysfs_root>/devices/system/node holds, at
// least 1 (a kernel without NUMA has none: it is one node).
int NumaNodeCount(const std::string& sysfs_root = "/sys");

// A page-aligned anonymous mapping, zeroed (the kernel's fresh pages),
// unmapped when destroyed. Empty (data() null) if the mapping failed.
class HostPages {
 public:
  HostPages() = default;
  ~HostPages();
  HostPages(HostPages&& other) noexcept;
  HostPages& operator=(HostPages&& other) noexcept;
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }  // mapped: the request rounded up to pages
  int requested_node() const { return node_; }
  bool bound() const { return bound_; }
  // Why the memory is not bound ("" when it is): "no node requested",
  // "one node", "mbind: Operation not permitted", ...
  const std::string& why_not_bound() const { return why_; }
  // "4096 bytes, node 1 requested, bound (preferred)", "..., not bound: one
  // node", "4096 bytes, no node requested".
  std::string Describe() const;

 private:
  friend HostPages AllocateOnNodes(size_t bytes, int node, int node_count);
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int node_ = -1;
  bool bound_ = false;
  std::string why_;
};

// `bytes` (at least one page) on NUMA node `node`, or anywhere for node -1.
// Where the machine has several nodes the pages prefer `node` (MPOL_PREFERRED,
// set before anything touches them, so first touch and pinning place them
// there; when that node runs out the kernel takes others rather than fail).
HostPages Allocate(size_t bytes, int node);
// As Allocate with the machine's node count given (tests: the mbind path on
// a one-node machine).
HostPages AllocateOnNodes(size_t bytes, int node, int node_count);

}  // namespace coarse::numa
