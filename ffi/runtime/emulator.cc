#include "runtime/emulator.h"

#include <algorithm>
#include <string>
#include <thread>

namespace coarse {
namespace ffi = xla::ffi;

namespace {

ffi::ErrorOr<bool> ReadTable(const ffi::Dictionary& attrs, const char* rate, const char* lat,
                             int64_t p, LinkTable* out) {
  auto r = attrs.get<ffi::Span<const double>>(rate);
  auto l = attrs.get<ffi::Span<const double>>(lat);
  if (r.has_error() || l.has_error()) return false;
  if (static_cast<int64_t>(r.value().size()) != p * p ||
      static_cast<int64_t>(l.value().size()) != p * p)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string("coarse_jax: topology attribute ") + rate + " is not " + std::to_string(p) +
        "x" + std::to_string(p)));
  out->s_per_byte.assign(r.value().begin(), r.value().end());
  out->latency_s.assign(l.value().begin(), l.value().end());
  return true;
}

// To the nearest tick (1 ns): a virtual clock's only rounding.
Clock::duration Seconds(double s) {
  return std::chrono::round<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

ffi::ErrorOr<bool> ParseTopology(const ffi::Dictionary& attrs, int64_t workers, Topology* out) {
  out->workers = workers;
  auto wp = ReadTable(attrs, "emu_wp_s_per_byte", "emu_wp_latency_s", workers, &out->wp);
  if (wp.has_error() || !wp.value()) return wp;
  auto pp = ReadTable(attrs, "emu_pp_s_per_byte", "emu_pp_latency_s", workers, &out->pp);
  if (pp.has_error()) return pp;
  auto ww = ReadTable(attrs, "emu_ww_s_per_byte", "emu_ww_latency_s", workers, &out->ww);
  if (ww.has_error()) return ww;
  if (!pp.value() || !ww.value())
    return ffi::Unexpected(
        ffi::Error::InvalidArgument("coarse_jax: incomplete topology attributes"));
  out->virtual_clock = false;
  if (attrs.contains("emu_virtual")) {
    auto v = attrs.get<int64_t>("emu_virtual");
    if (v.has_error()) return ffi::Unexpected(v.error());
    out->virtual_clock = v.value() != 0;
  }
  return true;
}

void SleepUntil(Clock::time_point t) {
  if (t > Clock::now()) std::this_thread::sleep_until(t);
}

Emulator::Emulator(const Topology& topology)
    : topo_(topology),
      p_(topology.workers),
      link_free_(4 * p_ * p_, Clock::time_point::min()),
      port_in_free_(2 * p_, Clock::time_point::min()),
      port_out_free_(2 * p_, Clock::time_point::min()),
      port_in_next_(2 * p_, 0),
      port_out_next_(2 * p_, 0) {}

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
  const Clock::duration busy = Seconds(bytes * t.s_per_byte[a * p_ + b]);
  const Clock::duration latency = Seconds(t.latency_s[a * p_ + b]);
  Clock::time_point& link = link_free_[src * 2 * p_ + dst];
  Clock::time_point start = std::max(not_before, link);
  if (serial_bus) start = std::max({start, port_out_free_[src], port_in_free_[dst]});
  link = start + busy;
  if (serial_bus) port_out_free_[src] = port_in_free_[dst] = start + busy;
  return start + busy + latency;
}

}  // namespace coarse
