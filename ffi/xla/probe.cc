// coarse_probe's XLA translation: reads the attributes (workers, site,
// timeout_ms, the emu_* topology) and the operands (the (tier, data) index,
// int32[4] device pairs, the payload) into a ProbeRequest and runs the probe
// (runtime/probe.h) into the float32[reps] result. CPU only:
// cpu/handlers_cpu.cc binds it.
#include "xla/probe.h"

#include "runtime/probe.h"
#include "xla/handler.h"
#include "xla/plan_attrs.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error ProbeBody(ffi::RunId run_id, ffi::AnyBuffer who_buf, ffi::AnyBuffer pairs_buf,
                     ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> times,
                     const ffi::Dictionary& attrs) {
  auto workers = attrs.get<int64_t>("workers");
  auto site = attrs.get<int64_t>("site");
  auto timeout_ms = attrs.get<int64_t>("timeout_ms");
  if (workers.has_error() || site.has_error() || timeout_ms.has_error())
    return ffi::Error::InvalidArgument("coarse_probe: missing workers/site/timeout_ms");
  const int64_t p = workers.value();
  auto proxies = ReadProxies(attrs, p);
  if (proxies.has_error()) return proxies.error();
  const int64_t q = proxies.value();
  auto who = ReadWho(who_buf, p, q);
  if (who.has_error()) return who.error();
  if (pairs_buf.element_type() != ffi::DataType::S32 || pairs_buf.element_count() != 4 ||
      times->element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("coarse_probe: expects int32[4] pairs and float32 times");

  Topology topo;
  auto emulated = ParseTopology(attrs, p, q, &topo);
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
  return RunProbe(request);
}

}  // namespace coarse
