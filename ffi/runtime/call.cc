// The first and last steps of every call (see call.h).
#include "runtime/call.h"

#include <string>

#include "runtime/dtype.h"

namespace coarse {

// How errors name a device (session.h). A proxy in host memory has no mesh
// coordinates: it is named by its number and the workers it serves.
std::string Who::Describe() const {
  if (tier == kProxy && on_host) {
    const int64_t lo = index * group, hi = lo + group - 1;
    return "proxy " + std::to_string(index) + " (in host memory, serving worker" +
           (group > 1 ? "s " + std::to_string(lo) + ".." + std::to_string(hi)
                      : " " + std::to_string(lo)) +
           ")";
  }
  const std::string head = std::string(tier == kWorker ? "worker " : "proxy ") +
                           std::to_string(index) +
                           " (tier=" + std::to_string(static_cast<int>(tier));
  if (tier == kWorker || group <= 1) return head + ", data=" + std::to_string(index) + ")";
  return head + ", data=" + std::to_string(index * group) + ".." +
         std::to_string(index * group + group - 1) + ", shared by workers " +
         std::to_string(index * group) + ".." + std::to_string(index * group + group - 1) + ")";
}

Status AcquireStorage(Call& call, Device& device) {
  if (call.plan().emulated && !device.SupportsEmulation())
    return Status::InvalidArgument(
        "coarse_jax: an emulated topology (Config(topology=...)) only runs on CPU devices: "
        "its links are timed on the host");
  if (!call.session->TakeFirstCall(call.device())) return Status::Success();
  for (int64_t d = 0; d < call.session->devices(); ++d) {
    if (d == call.device()) continue;
    Status e = device.Acquire(d);
    if (e.failure()) return e;
  }
  return Status::Success();
}

Status CheckLeaf(const Plan& plan, int64_t leaf, std::optional<DType> dtype, size_t element_count,
                 const char* op) {
  if (!dtype)
    return Status::InvalidArgument(std::string("coarse_jax: ") + op + ": tensor '" +
                                   plan.leaf_names[leaf] + "' has an unsupported dtype" +
                                   "; only float32, bfloat16 and float16 are synchronized");
  if (static_cast<int64_t>(element_count) != plan.leaf_nelems[leaf])
    return Status::InvalidArgument(std::string("coarse_jax: ") + op + ": tensor '" +
                                   plan.leaf_names[leaf] + "' has " +
                                   std::to_string(element_count) + " elements, the plan expects " +
                                   std::to_string(plan.leaf_nelems[leaf]));
  return Status::Success();
}

namespace {

// Where each proxy's job of `s` is that has not left it, for a timeout's message:
// "proxy 1 running, proxy 3 not started" (a job starts when it reaches the storage).
std::string ProxiesLeft(const Session& s) {
  std::string out;
  for (int64_t k = 0; k < s.q(); ++k) {
    const int64_t d = s.p() + k;
    if (s.Finished(d)) continue;
    out += (out.empty() ? "proxy " : ", proxy ") + std::to_string(k) +
           (s.Started(d) ? " running" : " not started");
  }
  return out.empty() ? "all have left" : out;
}

}  // namespace

Status FinishCall(Call& call, Device& device, Status status, bool last) {
  if (status.failure()) {
    // XLA runs none of this device's later calls: it is done with the
    // session, and with every other session of the execution it is in (a
    // sync site of the same program whose later calls it will not make: with
    // two value_and_updates, the first's pull after the second's failed
    // params check). Left open, those would hold their store until their
    // proxies timed out, and the next step would wait for them as long.
    std::vector<std::shared_ptr<Session>> sessions = {call.session};
    for (auto& other : SessionsOfRun(call.session->run_id()))
      if (other != call.session && other->InProgress(call.device())) sessions.push_back(other);
    for (auto& s : sessions) {
      s->Poison(status.message());
      // As on success, a worker returns once the proxies' jobs have left: the
      // step's error then means the session is over (no job of it still runs
      // while the user restores, reads the state or starts the next step).
      if (call.who.tier == kWorker && s->proxies_started()) s->AwaitProxiesLeft(call.who);
      s->Finish(call.device());
    }
    return status;
  }
  if (last) {
    // The proxies run as a service (service.h): a worker leaves only after
    // they have, so the step's outputs are ready only once the session is
    // over (its optimizer update committed, its storage free).
    if (call.who.tier == kWorker && call.session->proxies_started()) {
      Session& s = *call.session;
      Status e = s.Wait(
          call.who, Session::Waits::kPeer, [&] { return s.ProxiesFinished(); },
          [&] {
            return "the proxies to leave the session (their service jobs: " + ProxiesLeft(s) + ")";
          });
      // The proxies also leave a session that failed: their last act may be
      // releasing the ready flags a pull's copies waited for, over values
      // no proxy finished. The step then fails here, never returns them.
      if (e.success()) e = s.FailureOf(call.who, "finishing its last call");
      if (e.failure()) {
        s.Finish(call.device());
        return e;
      }
    }
    // Everything this device did to the storage (its reads included) is
    // what the next session's first calls will wait for.
    Status e = device.Publish();
    if (e.failure()) call.session->Poison(e.message());
    call.session->Finish(call.device());
    return e;
  }
  return status;
}

}  // namespace coarse
