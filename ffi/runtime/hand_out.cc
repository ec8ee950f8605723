// HandOut (hand_out.h): one meeting per (run, site, iteration), two phases:
// every device offers its chunk, then every device takes all chunks; the
// last to leave removes the meeting.
#include "runtime/hand_out.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace coarse {

namespace {

struct Meeting {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<const void*> chunks;
  std::vector<char> took;  // [device]: has read every chunk
  int64_t offered = 0, taken = 0, left = 0;
  bool failed = false;
  std::string error;
};

using Key = std::tuple<int64_t, int64_t, int64_t>;  // run, site, iteration

struct Registry {
  std::mutex mu;
  std::map<Key, std::shared_ptr<Meeting>> meetings;
  // Per (run, site, device): how many meetings of (run, site) the device
  // joined (its next iteration). Bounded: runs never come back.
  std::map<Key, int64_t> iterations;
  std::deque<Key> order;
};

Registry& TheRegistry() {
  static Registry* r = new Registry;
  return *r;
}

constexpr size_t kMaxIterationCounters = 4096;

std::shared_ptr<Meeting> Join(int64_t run_id, int64_t site, int64_t device, int64_t devices) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  const Key dev_key{run_id, site, device};
  auto it = r.iterations.find(dev_key);
  if (it == r.iterations.end()) {
    it = r.iterations.emplace(dev_key, 0).first;
    r.order.push_back(dev_key);
    while (r.order.size() > kMaxIterationCounters) {
      r.iterations.erase(r.order.front());
      r.order.pop_front();
    }
  }
  const Key key{run_id, site, it->second++};
  auto& m = r.meetings[key];
  if (!m) {
    m = std::make_shared<Meeting>();
    m->chunks.assign(devices, nullptr);
    m->took.assign(devices, 0);
  }
  return m;
}

void Leave(int64_t run_id, int64_t site, const std::shared_ptr<Meeting>& m, int64_t devices) {
  bool last;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    last = ++m->left == devices;
  }
  if (!last) return;
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.meetings.begin(); it != r.meetings.end(); ++it)
    if (it->second == m && std::get<0>(it->first) == run_id && std::get<1>(it->first) == site) {
      r.meetings.erase(it);
      break;
    }
}

}  // namespace

Status HandOut(int64_t run_id, int64_t site, int64_t device, int64_t devices, const void* chunk,
               int64_t timeout_ms, const std::function<void(int64_t, const void*)>& take,
               const std::function<std::string(int64_t)>& describe) {
  if (device < 0 || device >= devices)
    return Status::InvalidArgument("coarse_host_gather: device " + std::to_string(device) +
                                   " is outside the host's " + std::to_string(devices) +
                                   " devices");
  std::shared_ptr<Meeting> m = Join(run_id, site, device, devices);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // Waits until `count` reaches `devices`; on timeout fails the meeting,
  // naming the devices `missing` lists.
  auto wait_all = [&](std::unique_lock<std::mutex>& lock, int64_t& count, const char* what,
                      const std::function<std::vector<int64_t>()>& missing) -> Status {
    while (count < devices && !m->failed)
      if (m->cv.wait_until(lock, deadline) == std::cv_status::timeout && count < devices &&
          !m->failed) {
        std::string names;
        for (int64_t d : missing()) names += (names.empty() ? "" : ", ") + describe(d);
        m->failed = true;
        m->error = "coarse_host_gather: " + describe(device) + " waited " +
                   std::to_string(timeout_ms / 1000.0) + " s for " + what + " of " + names +
                   " (Config.timeout_s); the in-host hand-out of the inter-host step gave up";
        m->cv.notify_all();
      }
    if (m->failed) return Status::Internal(m->error);
    return Status::Success();
  };
  Status status = Status::Success();
  {
    std::unique_lock<std::mutex> lock(m->mu);
    m->chunks[device] = chunk;
    ++m->offered;
    m->cv.notify_all();
    status = wait_all(lock, m->offered, "the chunk", [&] {
      std::vector<int64_t> out;
      for (int64_t d = 0; d < devices; ++d)
        if (m->chunks[d] == nullptr) out.push_back(d);
      return out;
    });
  }
  if (status.success()) {
    // Peers' chunks stay alive: their owners wait below until all took them.
    for (int64_t d = 0; d < devices; ++d) take(d, m->chunks[d]);
    std::unique_lock<std::mutex> lock(m->mu);
    ++m->taken;
    m->took[device] = 1;
    m->cv.notify_all();
    status = wait_all(lock, m->taken, "the reads of its chunk", [&] {
      std::vector<int64_t> out;
      for (int64_t d = 0; d < devices; ++d)
        if (!m->took[d]) out.push_back(d);
      return out;
    });
  }
  Leave(run_id, site, m, devices);
  return status;
}

int64_t LiveHandOuts() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return static_cast<int64_t>(r.meetings.size());
}

}  // namespace coarse
