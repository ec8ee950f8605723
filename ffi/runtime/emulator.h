// Interconnect emulation (coarse.Topology): how long each transfer takes.
//
// Every transfer of the runtime names a directed link (src device -> dst
// device) and a byte count. Without a topology it is just the copy. With one,
// the transfer also lasts latency + bytes * seconds_per_byte on that link:
// Reserve() books the link from max(ready, link free) for bytes/bandwidth and
// returns the arrival time (booking + latency); the receiver waits until
// then. The receiver books, in the order it consumes (a proxy walks pieces in
// plan order), with the time the sender made the data ready: booking at issue
// time instead would let whichever thread the OS ran first take a shared
// port for all its transfers, which no link arbiter does. Links are full
// duplex (each direction booked separately). A worker<->proxy transfer also
// books the worker's and the proxy's serial-bus port (one transfer in, one
// out at a time), so clients crowding one proxy (DENSE) queue as on
// hardware. Durations arrive already multiplied by the topology's time_scale.
// Proxies in host memory (attribute emu_host_proxies, coarse.Topology
// proxies_on="host") have no serial-bus port: a worker<->host proxy transfer
// books the link and the worker's port only (its host link, whose rate the
// topology gives already shared with the root complex), so k workers reach
// one host proxy at once.
//
// Two clocks (coarse.Topology(clock=...)):
// * "real": times are the host's steady clock and a receiver sleeps until
//   the arrival, so what is measured is wall time, host noise included (for
//   demos and benchmarks).
// * "virtual": every device of a session keeps a simulated clock that starts
//   at 0. A transfer is booked from the simulated time its data was ready,
//   and a wait moves the waiter's clock to the arrival instead of sleeping
//   (Session::Now / AdvanceTo). The protocol still runs for real and the
//   results are exact; only time is simulated, so timings are repeatable and
//   cost no sleep. Host work (copies, additions) takes no simulated time.
// The Emulator does the same arithmetic for both: it only sees time points.
// The emu_* attributes that describe a Topology are read by the handlers
// (ffi/xla/plan_attrs.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace coarse {

using Clock = std::chrono::steady_clock;

// Time points as the int64 tick counts kept in atomics (1 tick = 1 ns).
inline int64_t Ticks(Clock::time_point t) { return t.time_since_epoch().count(); }
inline Clock::time_point AtTicks(int64_t ticks) {
  return Clock::time_point(Clock::duration(ticks));
}

// Real clock: sleeps until `t` if it lies ahead.
void SleepUntil(Clock::time_point t);

enum class LinkKind { kWorkerProxy, kProxyProxy, kWorkerWorker };

struct LinkTable {
  std::vector<double> s_per_byte;  // [src_index * cols + dst_index]
  std::vector<double> latency_s;
  int64_t cols = 0;
};

struct Topology {
  int64_t workers = 0;         // p
  int64_t proxies = 0;         // q
  bool virtual_clock = false;  // attribute emu_virtual (see above)
  bool host_proxies = false;   // attribute emu_host_proxies: proxies have no port
  // wp is p x q, indexed [worker][proxy] for both directions; pp q x q; ww p x p.
  LinkTable wp, pp, ww;
};

// Across hosts (coarse.Topology inter_host_*): the inter-host step is booked
// from when the host's own synchronization ended, i.e. when the last of its
// devices finished its last call of the Session (Session::Finish, real
// clock). Keyed by (FFI RunId, call site): within one run a site's next
// session cannot end before every device of the host has passed this one's
// inter-host step, so the newest end is the one asked for. Bounded: runs
// never come back.
void NoteSyncEnd(int64_t run_id, int64_t site, Clock::time_point end);
std::optional<Clock::time_point> SyncEnd(int64_t run_id, int64_t site);

class Emulator {
 public:
  explicit Emulator(const Topology& topology);

  // Books a transfer of `bytes` from device `src` to device `dst` (worker i =
  // i, proxy k = p + k, k < q), starting no earlier than `not_before`, and returns
  // when it arrives. A start in the past is fine: the transfer ran in the
  // background while the receiver was busy.
  Clock::time_point Reserve(int64_t src, int64_t dst, double bytes, Clock::time_point not_before);

  // Reserve for a worker<->proxy transfer, booked on each serial-bus port in
  // a fixed order: it waits until `src_rank` earlier transfers have booked
  // src's out port and `dst_rank` dst's in port. Ports are shared by transfers
  // that different threads book (a worker's pushes to two proxies, a proxy's
  // pulls by several workers); first come, first served would order them by
  // which thread the OS ran first, so the same step would take different
  // times. The ranks (Plan: the plan's global order) make it the same every
  // run. Returns nullopt when `give_up()` says so (checked while waiting).
  std::optional<Clock::time_point> ReserveInOrder(int64_t src, int64_t dst, double bytes,
                                                  Clock::time_point not_before, int64_t src_rank,
                                                  int64_t dst_rank,
                                                  const std::function<bool()>& give_up);

 private:
  const LinkTable& Table(int64_t src, int64_t dst, int64_t* a, int64_t* b) const;
  Clock::time_point BookLocked(int64_t src, int64_t dst, double bytes,
                               Clock::time_point not_before);

  Topology topo_;
  int64_t p_, devices_;  // workers, workers + proxies
  std::mutex mu_;
  std::vector<Clock::time_point> link_free_;                     // [src * devices + dst]
  std::vector<Clock::time_point> port_in_free_, port_out_free_;  // [device]
  std::vector<int64_t> port_in_next_, port_out_next_;  // [device]: rank of the next booking
  std::condition_variable cv_;
};

}  // namespace coarse
