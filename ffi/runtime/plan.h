// The synchronization plan as the runtime sees it: pieces, segments, routes and
// the storage layout every proxy uses for them.
//
// The Python planner (coarse_jax/plan/) decides everything; it hands the
// decisions to every custom call as FFI attributes (plain int64 arrays), so a
// compiled program carries its own plan and nothing is registered out of band.
// The handlers parse a plan once per process (cached by `plan_key`,
// ffi/xla/plan_attrs.h); the runtime only reads the parsed Plan.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/emulator.h"
#include "runtime/status.h"

namespace coarse {

// A run of consecutive elements of one leaf that lives inside one piece.
struct Segment {
  int64_t leaf;       // leaf id in sync order (proxy leaves first, then leading)
  int64_t leaf_off;   // element offset inside the leaf
  int64_t len;        // number of elements
  int64_t piece;      // piece id (global order)
  int64_t piece_off;  // element offset inside the piece
};

struct Plan {
  int64_t key = 0;      // hash of everything below, from Python
  int64_t workers = 0;  // p
  // q, dividing p: each proxy serves a group of k = p / q workers (COARSE
  // k:1); proxy j's group is workers j*k .. j*k + k - 1, its first worker
  // its local pair. Devices are numbered worker i -> i, proxy j -> p + j.
  int64_t proxies = 0;
  int64_t timeout_ms = 0;  // every wait gives up after this long
  bool mean = true;        // scale the sum by 1/p

  // Pieces: the unit that is routed, queued and ring-reduced.
  std::vector<int64_t> piece_nelems;
  std::vector<int64_t> piece_nbytes;      // on the wire: the leaves' own dtypes
  std::vector<int32_t> piece_holder;      // the one proxy every worker routes to, or -1
  std::vector<int32_t> piece_dest;        // [piece * p + worker] -> proxy (0..q-1)
  std::vector<Segment> segments;          // sorted by piece
  std::vector<int64_t> piece_seg_begin;   // [num_pieces + 1]
  std::vector<int64_t> piece_shard;       // shard index of the piece in its leaf
  std::vector<int64_t> piece_num_shards;  // shard count of that leaf
  // The push (plan bucket, one coarse_push) each piece is in, in order:
  // its pieces land together. Empty (a plan built in C++, the lab's): a push
  // per leaf run, FinishPlan fills it so.
  std::vector<int64_t> piece_push;

  // Leaves in sync order.
  std::vector<int64_t> leaf_nelems;
  std::vector<std::string> leaf_names;
  int64_t num_proxy_leaves = 0;  // leaves [0, num_proxy_leaves) go through proxies
  int64_t leading_nelems = 0;    // leaves after them are reduced among workers
  int64_t leading_nbytes = 0;

  bool trace = false;     // record a timeline (Config(trace=True), runtime/trace.h)
  bool emulated = false;  // transfers follow `topology` (coarse.Topology)
  Topology topology;

  // Proxy storage layout (derived from the routes): for proxy k and piece s,
  // the workers routing s to k in ascending order, one f32 slot each; slot 0
  // is the accumulator ("own" buffer) the ring works on. A proxy nobody routes
  // s to still keeps one slot, zero-filled, as its ring contribution.
  std::vector<std::vector<int32_t>> contributors;  // [k * S + s]
  std::vector<int64_t> slot_begin;                 // [k * S + s] -> arena offset
  std::vector<int64_t> arena_nelems;               // [k], k < q

  // Emulated serial-bus ports (emulator.h, ReserveInOrder): transfers book a
  // port in the plan's global order. A worker pushes, and pulls, piece s as
  // its s-th transfer on its port; a proxy serves (s, worker) pairs in
  // ascending order, pushes in and pulls out alike.
  std::vector<int64_t> proxy_port_rank;  // [piece * p + worker]

  int64_t num_pieces() const { return static_cast<int64_t>(piece_nelems.size()); }
  int64_t devices() const { return workers + proxies; }     // mesh devices the runtime numbers
  int64_t group_size() const { return workers / proxies; }  // k: workers per proxy
  // The worker that sets proxy j's optimizer up and carries its chunks
  // across hosts: the first of its group (its local pair).
  int64_t group_leader(int64_t proxy) const { return proxy * group_size(); }
  // Worker w's local proxy (the one of its group), or -1 if w leads no group.
  int64_t led_proxy(int64_t worker) const {
    return worker % group_size() == 0 ? worker / group_size() : -1;
  }
  int32_t dest(int64_t piece, int64_t worker) const { return piece_dest[piece * workers + worker]; }
  int64_t slot(int64_t proxy, int64_t piece, int64_t j) const {
    return slot_begin[proxy * num_pieces() + piece] + j * piece_nelems[piece];
  }
  const std::vector<int32_t>& contributors_of(int64_t proxy, int64_t piece) const {
    return contributors[proxy * num_pieces() + piece];
  }
  // "tensor 'params/w' [shard 2/5]": how errors name a piece.
  std::string DescribePiece(int64_t piece) const;
};

// The 32-bit key by which the hosts of a mesh check that they run one plan
// (coarse_proxy_ring's keys operand is int32[hosts]). Python reads it through
// the extension (host_plan_key), never computing it again.
inline int32_t HostPlanKey(int64_t key) { return static_cast<int32_t>(key & 0x7fffffff); }

// Steps in one ring of p members (runtime/ring.h): reduce-scatter then
// all-gather. Here, below the session, which sizes its step counters by it.
inline int32_t RingSteps(int64_t p) { return static_cast<int32_t>(2 * (p - 1)); }

// Derives what follows from the routes and segments (shard numbering, DENSE
// holders, contributors, the proxies' storage layout). GetPlan
// (ffi/xla/plan_attrs.h) calls it; so does the self-test (lab/sync_selftest.h), which
// builds a Plan by hand.
void FinishPlan(Plan* plan);

}  // namespace coarse
