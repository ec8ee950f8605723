// coarse_probe's XLA translation: reads the attributes (workers, site,
// timeout_ms, the emu_* topology, optional host_proxies) and the operands (the (tier, data) index,
// int32[4] device pairs, the payload) into a ProbeRequest and runs the probe
// (runtime/probe.h) into the float32[reps] result. CPU only:
// cpu/handlers_cpu.cc binds it. The one call that keeps ffi::Dictionary:
// its set varies with what is profiled (coarse_jax/profiling/measure.py
// passes proxies, the emu_* tables and host_proxies only for k:1 meshes,
// emulated links and host proxies), so it is read here by name.
#include "xla/probe.h"

#include "runtime/probe.h"
#include "xla/handler.h"
#include "xla/plan_attrs.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// The emu_* tables the call has (coarse.Topology.ffi_attrs); none: empty.
TopologyAttrs TopologyOf(const ffi::Dictionary& attrs) {
  auto table = [&](const char* name) {
    auto v = attrs.get<ffi::Span<const double>>(name);
    return v.has_value() ? v.value() : ffi::Span<const double>();
  };
  auto flag = [&](const char* name) {
    auto v = attrs.get<int64_t>(name);
    return v.has_value() && v.value() != 0;
  };
  return TopologyAttrs{table("emu_wp_s_per_byte"), table("emu_wp_latency_s"),
                       table("emu_pp_s_per_byte"), table("emu_pp_latency_s"),
                       table("emu_ww_s_per_byte"), table("emu_ww_latency_s"),
                       flag("emu_virtual"),        flag("emu_host_proxies")};
}

}  // namespace

ffi::Error ProbeBody(ffi::RunId run_id, ffi::AnyBuffer who_buf, ffi::AnyBuffer pairs_buf,
                     ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> times,
                     const ffi::Dictionary& attrs) {
  auto workers = attrs.get<int64_t>("workers");
  auto site = attrs.get<int64_t>("site");
  auto timeout_ms = attrs.get<int64_t>("timeout_ms");
  if (workers.has_error() || site.has_error() || timeout_ms.has_error())
    return ffi::Error::InvalidArgument("coarse_probe: missing workers/site/timeout_ms");
  const int64_t p = workers.value();
  auto given = attrs.get<int64_t>("proxies");  // absent: 1:1
  auto proxies = CheckProxies(given.has_value() ? given.value() : p, p);
  if (proxies.has_error()) return proxies.error();
  const int64_t q = proxies.value();
  auto who = ReadWho(who_buf, p, q);
  if (who.has_error()) return who.error();
  if (pairs_buf.element_type() != ffi::DataType::S32 || pairs_buf.element_count() != 4 ||
      times->element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("coarse_probe: expects int32[4] pairs and float32 times");

  Topology topo;
  auto emulated = ParseTopology(TopologyOf(attrs), p, q, &topo);
  if (emulated.has_error()) return emulated.error();

  ProbeRequest request;
  request.run_id = run_id.run_id;
  request.site = site.value();
  request.workers = p;
  request.proxies = q;
  request.who = who.value();
  request.pairs = static_cast<const int32_t*>(pairs_buf.untyped_data());
  request.payload = payload.untyped_data();
  request.nbytes = static_cast<int64_t>(payload.size_bytes());
  request.topology = emulated.value() ? &topo : nullptr;
  request.timeout = std::chrono::milliseconds(timeout_ms.value());
  request.times = static_cast<float*>(times->untyped_data());
  request.reps = times->element_count();
  if (attrs.contains("host_proxies")) {
    auto host = attrs.get<int64_t>("host_proxies");
    if (host.has_error()) return host.error();
    request.host_proxies = host.value() != 0;
  }
  if (request.host_proxies) {
    // The worker's times, then those of the host proxy it stands for (probe.h).
    if (request.reps % 2 != 0 || who.value().device(p) >= p)
      return ffi::Error::InvalidArgument(
          "coarse_probe: with host_proxies only workers call, with float32[2 * reps] times");
    request.reps /= 2;
  }
  return ToXlaError(RunProbe(request));
}

}  // namespace coarse
