// GetPlan and ParseTopology: the plan's and the topology's attributes, checked
// and parsed into runtime types (see xla/plan_attrs.h).
#include "xla/plan_attrs.h"

#include <algorithm>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace coarse {
namespace ffi = xla::ffi;

namespace {

ffi::Error Invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("coarse_jax: malformed plan: " + what);
}

ffi::ErrorOr<std::shared_ptr<const Plan>> Parse(const PlanAttrs& attrs) {
  auto plan = std::make_shared<Plan>();
  plan->key = attrs.plan_key;
  const int64_t workers = attrs.workers, timeout_ms = attrs.timeout_ms;
  const int64_t num_proxy_leaves = attrs.num_proxy_leaves, leading_nbytes = attrs.leading_nbytes;
  const ffi::Span<const int64_t> piece_nelems = attrs.piece_nelems,
                                 piece_nbytes = attrs.piece_nbytes, piece_dest = attrs.piece_dest,
                                 segments = attrs.segments, leaf_nelems = attrs.leaf_nelems;
  const std::string_view leaf_names = attrs.leaf_names;
  const int64_t p = workers;
  const int64_t S = static_cast<int64_t>(piece_nelems.size());
  const int64_t L = static_cast<int64_t>(leaf_nelems.size());
  if (p < 1) return ffi::Unexpected(Invalid("workers must be >= 1, got " + std::to_string(p)));
  auto proxies = CheckProxies(attrs.proxies, p);
  if (proxies.has_error()) return ffi::Unexpected(proxies.error());
  const int64_t q = proxies.value();
  if (timeout_ms < 0)
    return ffi::Unexpected(Invalid("timeout_ms must be >= 0, got " + std::to_string(timeout_ms)));
  if (num_proxy_leaves < 0 || num_proxy_leaves > L)
    return ffi::Unexpected(Invalid("num_proxy_leaves must be in [0, " + std::to_string(L) +
                                   "] (the length of leaf_nelems), got " +
                                   std::to_string(num_proxy_leaves)));
  if (leading_nbytes < 0) return ffi::Unexpected(Invalid("leading_nbytes must be >= 0"));
  if (static_cast<int64_t>(piece_nbytes.size()) != S)
    return ffi::Unexpected(Invalid("piece_nbytes has " + std::to_string(piece_nbytes.size()) +
                                   " entries, piece_nelems " + std::to_string(S)));
  if (static_cast<int64_t>(piece_dest.size()) != S * p)
    return ffi::Unexpected(
        Invalid("piece_dest has " + std::to_string(piece_dest.size()) +
                " entries, expected pieces x workers = " + std::to_string(S * p)));
  const ffi::Span<const int64_t> piece_push = attrs.piece_push;
  if (static_cast<int64_t>(piece_push.size()) != S)
    return ffi::Unexpected(Invalid("piece_push has " + std::to_string(piece_push.size()) +
                                   " entries, piece_nelems " + std::to_string(S)));
  for (int64_t s = 0; s < S; ++s)
    if (piece_push[s] < 0 || (s > 0 && piece_push[s] < piece_push[s - 1]))
      return ffi::Unexpected(Invalid("piece_push must be >= 0 and non-decreasing, got " +
                                     std::to_string(piece_push[s]) + " at piece " +
                                     std::to_string(s)));
  if (segments.size() % 5 != 0)
    return ffi::Unexpected(Invalid("segments' length is not a multiple of 5"));
  for (int64_t s = 0; s < S; ++s)
    if (piece_nelems[s] < 0 || piece_nbytes[s] < 0)
      return ffi::Unexpected(
          Invalid("piece_nelems / piece_nbytes of piece " + std::to_string(s) + " must be >= 0"));
  for (int64_t l = 0; l < L; ++l)
    if (leaf_nelems[l] < 0)
      return ffi::Unexpected(Invalid("leaf_nelems of leaf " + std::to_string(l) + " is negative"));

  plan->workers = p;
  plan->proxies = q;
  plan->timeout_ms = timeout_ms;
  plan->mean = attrs.mean;
  plan->num_proxy_leaves = num_proxy_leaves;
  plan->piece_nelems.assign(piece_nelems.begin(), piece_nelems.end());
  plan->piece_nbytes.assign(piece_nbytes.begin(), piece_nbytes.end());
  plan->piece_push.assign(piece_push.begin(), piece_push.end());
  plan->leading_nbytes = leading_nbytes;
  plan->trace = attrs.trace;
  auto emulated = ParseTopology(attrs.topology, p, q, &plan->topology);
  if (emulated.has_error()) return ffi::Unexpected(emulated.error());
  plan->emulated = emulated.value();
  plan->piece_dest.reserve(piece_dest.size());
  for (int64_t d : piece_dest) {
    if (d < 0 || d >= q)
      return ffi::Unexpected(Invalid("piece_dest routes to proxy " + std::to_string(d) +
                                     ", outside [0, " + std::to_string(q) + ")"));
    plan->piece_dest.push_back(static_cast<int32_t>(d));
  }
  plan->leaf_nelems.assign(leaf_nelems.begin(), leaf_nelems.end());
  for (int64_t i = num_proxy_leaves; i < static_cast<int64_t>(leaf_nelems.size()); ++i)
    plan->leading_nelems += leaf_nelems[i];

  size_t start = 0;
  while (start <= leaf_names.size()) {
    size_t end = leaf_names.find('\n', start);
    if (end == std::string_view::npos) end = leaf_names.size();
    plan->leaf_names.emplace_back(leaf_names.substr(start, end - start));
    start = end + 1;
  }
  plan->leaf_names.resize(leaf_nelems.size());

  // Segments, and for each piece the range of its segments.
  const int64_t G = static_cast<int64_t>(segments.size() / 5);
  plan->segments.reserve(G);
  plan->piece_seg_begin.assign(S + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    Segment s{segments[5 * g], segments[5 * g + 1], segments[5 * g + 2], segments[5 * g + 3],
              segments[5 * g + 4]};
    auto bad = [&](const std::string& why) {
      return ffi::Unexpected(Invalid(
          "segment " + std::to_string(g) + " (leaf " + std::to_string(s.leaf) + ", leaf_off " +
          std::to_string(s.leaf_off) + ", len " + std::to_string(s.len) + ", piece " +
          std::to_string(s.piece) + ", piece_off " + std::to_string(s.piece_off) + "): " + why));
    };
    if (s.piece < 0 || s.piece >= S)
      return bad("piece outside [0, " + std::to_string(S) + ") (the length of piece_nelems)");
    // Pieces carry proxy leaves only: leaves from num_proxy_leaves on are
    // the leading layers, reduced by the worker ring.
    if (s.leaf < 0 || s.leaf >= num_proxy_leaves)
      return bad("leaf outside [0, " + std::to_string(num_proxy_leaves) + ") (num_proxy_leaves)");
    if (s.len < 0 || s.leaf_off < 0 || s.piece_off < 0)
      return bad("leaf_off, len and piece_off must be >= 0");
    // Written so that no sum overflows: all terms are >= 0 here.
    if (s.len > leaf_nelems[s.leaf] || s.leaf_off > leaf_nelems[s.leaf] - s.len)
      return bad("leaf_off + len exceeds the leaf's " + std::to_string(leaf_nelems[s.leaf]) +
                 " elements");
    if (s.len > piece_nelems[s.piece] || s.piece_off > piece_nelems[s.piece] - s.len)
      return bad("piece_off + len exceeds the piece's " + std::to_string(piece_nelems[s.piece]) +
                 " elements");
    if (g > 0 && s.piece < plan->segments.back().piece)
      return bad("segments are not sorted by piece");
    plan->segments.push_back(s);
    plan->piece_seg_begin[s.piece + 1] = g + 1;
  }
  for (int64_t s = 1; s <= S; ++s)
    plan->piece_seg_begin[s] = std::max(plan->piece_seg_begin[s], plan->piece_seg_begin[s - 1]);
  for (int64_t s = 0; s < S; ++s)
    if (plan->piece_seg_begin[s + 1] == plan->piece_seg_begin[s])
      return ffi::Unexpected(Invalid("piece " + std::to_string(s) + " has no segment"));

  FinishPlan(plan.get());
  return std::shared_ptr<const Plan>(std::move(plan));
}

ffi::ErrorOr<bool> ReadTable(ffi::Span<const double> rate, ffi::Span<const double> lat,
                             const char* name, int64_t rows, int64_t cols, LinkTable* out) {
  if (static_cast<int64_t>(rate.size()) != rows * cols ||
      static_cast<int64_t>(lat.size()) != rows * cols)
    return ffi::Unexpected(ffi::Error::InvalidArgument(std::string("coarse_jax: topology table ") +
                                                       name + " is not " + std::to_string(rows) +
                                                       "x" + std::to_string(cols)));
  out->cols = cols;
  out->s_per_byte.assign(rate.begin(), rate.end());
  out->latency_s.assign(lat.begin(), lat.end());
  return true;
}

}  // namespace

ffi::ErrorOr<int64_t> CheckProxies(int64_t proxies, int64_t workers) {
  if (proxies < 1 || proxies > workers || workers % proxies != 0)
    return ffi::Unexpected(
        ffi::Error::InvalidArgument("coarse_jax: attribute proxies must divide workers (" +
                                    std::to_string(workers) + "), got " + std::to_string(proxies)));
  return proxies;
}

ffi::ErrorOr<bool> ParseTopology(const TopologyAttrs& attrs, int64_t workers, int64_t proxies,
                                 Topology* out) {
  out->workers = workers;
  out->proxies = proxies;
  if (attrs.wp_s_per_byte.size() == 0 && attrs.pp_s_per_byte.size() == 0 &&
      attrs.ww_s_per_byte.size() == 0)
    return false;
  auto wp = ReadTable(attrs.wp_s_per_byte, attrs.wp_latency_s, "wp", workers, proxies, &out->wp);
  if (wp.has_error()) return wp;
  auto pp = ReadTable(attrs.pp_s_per_byte, attrs.pp_latency_s, "pp", proxies, proxies, &out->pp);
  if (pp.has_error()) return pp;
  auto ww = ReadTable(attrs.ww_s_per_byte, attrs.ww_latency_s, "ww", workers, workers, &out->ww);
  if (ww.has_error()) return ww;
  out->virtual_clock = attrs.virtual_clock;
  out->host_proxies = attrs.host_proxies;
  return true;
}

namespace {

// Parsed plans by plan_key, least recently used evicted beyond the limit.
// Sessions hold their plan by shared_ptr, so evicting a plan in use only
// means the next call of it parses its attributes again.
class PlanCache {
 public:
  std::shared_ptr<const Plan> Find(int64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  std::shared_ptr<const Plan> Insert(int64_t key, std::shared_ptr<const Plan> plan) {
    std::vector<std::shared_ptr<const Plan>> evicted;  // released outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->second;  // another thread parsed it first
    lru_.emplace_front(key, std::move(plan));
    index_[key] = lru_.begin();
    std::shared_ptr<const Plan> out = lru_.front().second;
    TrimLocked(&evicted);
    return out;
  }
  void SetLimit(int64_t limit) {
    std::vector<std::shared_ptr<const Plan>> evicted;
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = limit;
    TrimLocked(&evicted);
  }
  int64_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }
  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(lru_.size());
  }

 private:
  void TrimLocked(std::vector<std::shared_ptr<const Plan>>* evicted) {
    while (static_cast<int64_t>(lru_.size()) > limit_) {
      index_.erase(lru_.back().first);
      evicted->push_back(std::move(lru_.back().second));
      lru_.pop_back();
    }
  }

  std::mutex mu_;
  int64_t limit_ = kDefaultCachedPlans;
  std::list<std::pair<int64_t, std::shared_ptr<const Plan>>> lru_;  // most recent first
  std::unordered_map<int64_t, decltype(lru_)::iterator> index_;
};

PlanCache& ThePlanCache() {
  static PlanCache* cache = new PlanCache;
  return *cache;
}

}  // namespace

ffi::ErrorOr<std::shared_ptr<const Plan>> GetPlan(const PlanAttrs& attrs) {
  if (auto cached = ThePlanCache().Find(attrs.plan_key)) return cached;
  auto parsed = Parse(attrs);
  if (parsed.has_error()) return parsed;
  return ThePlanCache().Insert(attrs.plan_key, parsed.value());
}

void SetPlanCacheLimit(int64_t plans) { ThePlanCache().SetLimit(plans); }
int64_t PlanCacheLimit() { return ThePlanCache().limit(); }
int64_t CachedPlans() { return ThePlanCache().size(); }

}  // namespace coarse
