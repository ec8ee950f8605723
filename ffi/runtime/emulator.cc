// The Emulator's link and port bookings (see emulator.h).
#include "runtime/emulator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>

namespace coarse {
namespace {

// To the nearest tick (1 ns): a virtual clock's only rounding.
Clock::duration Seconds(double s) {
  return std::chrono::round<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

namespace {

struct SyncEnds {
  std::mutex mu;
  std::map<std::pair<int64_t, int64_t>, Clock::time_point> ends;
  std::deque<std::pair<int64_t, int64_t>> order;
};

SyncEnds& TheSyncEnds() {
  static SyncEnds* s = new SyncEnds;
  return *s;
}

constexpr size_t kMaxSyncEnds = 4096;

}  // namespace

void NoteSyncEnd(int64_t run_id, int64_t site, Clock::time_point end) {
  SyncEnds& s = TheSyncEnds();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::pair<int64_t, int64_t> key{run_id, site};
  if (s.ends.insert_or_assign(key, end).second) {
    s.order.push_back(key);
    while (s.order.size() > kMaxSyncEnds) {
      s.ends.erase(s.order.front());
      s.order.pop_front();
    }
  }
}

std::optional<Clock::time_point> SyncEnd(int64_t run_id, int64_t site) {
  SyncEnds& s = TheSyncEnds();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.ends.find({run_id, site});
  if (it == s.ends.end()) return std::nullopt;
  return it->second;
}

void SleepUntil(Clock::time_point t) {
  if (t > Clock::now()) std::this_thread::sleep_until(t);
}

Emulator::Emulator(const Topology& topology)
    : topo_(topology),
      p_(topology.workers),
      devices_(topology.workers + topology.proxies),
      link_free_(devices_ * devices_, Clock::time_point::min()),
      port_in_free_(devices_, Clock::time_point::min()),
      port_out_free_(devices_, Clock::time_point::min()),
      port_in_next_(devices_, 0),
      port_out_next_(devices_, 0) {}

const LinkTable& Emulator::Table(int64_t src, int64_t dst, int64_t* a, int64_t* b) const {
  const bool src_worker = src < p_, dst_worker = dst < p_;
  const int64_t si = src_worker ? src : src - p_, di = dst_worker ? dst : dst - p_;
  if (src_worker && dst_worker) {
    *a = si, *b = di;
    return topo_.ww;
  }
  if (!src_worker && !dst_worker) {
    *a = si, *b = di;
    return topo_.pp;
  }
  // Worker<->proxy: one table indexed [worker][proxy] for both directions.
  *a = src_worker ? si : di;
  *b = src_worker ? di : si;
  return topo_.wp;
}

Clock::time_point Emulator::Reserve(int64_t src, int64_t dst, double bytes,
                                    Clock::time_point not_before) {
  std::lock_guard<std::mutex> lock(mu_);
  return BookLocked(src, dst, bytes, not_before);
}

std::optional<Clock::time_point> Emulator::ReserveInOrder(int64_t src, int64_t dst, double bytes,
                                                          Clock::time_point not_before,
                                                          int64_t src_rank, int64_t dst_rank,
                                                          const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mu_);
  while (port_out_next_[src] != src_rank || port_in_next_[dst] != dst_rank) {
    if (give_up()) return std::nullopt;
    // Short slices: give_up() also watches for another device's failure.
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  const Clock::time_point arrival = BookLocked(src, dst, bytes, not_before);
  ++port_out_next_[src];
  ++port_in_next_[dst];
  cv_.notify_all();
  return arrival;
}

Clock::time_point Emulator::BookLocked(int64_t src, int64_t dst, double bytes,
                                       Clock::time_point not_before) {
  int64_t a, b;
  const LinkTable& t = Table(src, dst, &a, &b);
  const bool serial_bus = (src < p_) != (dst < p_);
  // The ports booked: both devices', or with host proxies the worker's only.
  const bool book_out = serial_bus && (src < p_ || !topo_.host_proxies);
  const bool book_in = serial_bus && (dst < p_ || !topo_.host_proxies);
  const Clock::duration busy = Seconds(bytes * t.s_per_byte[a * t.cols + b]);
  const Clock::duration latency = Seconds(t.latency_s[a * t.cols + b]);
  Clock::time_point& link = link_free_[src * devices_ + dst];
  Clock::time_point start = std::max(not_before, link);
  if (book_out) start = std::max(start, port_out_free_[src]);
  if (book_in) start = std::max(start, port_in_free_[dst]);
  link = start + busy;
  if (book_out) port_out_free_[src] = start + busy;
  if (book_in) port_in_free_[dst] = start + busy;
  return start + busy + latency;
}

}  // namespace coarse
