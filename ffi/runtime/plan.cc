// FinishPlan and Plan::DescribePiece (see plan.h); the attributes are parsed
// in ffi/xla/plan_attrs.cc.
#include "runtime/plan.h"

#include <algorithm>
#include <string>
#include <vector>

namespace coarse {

void FinishPlan(Plan* plan) {
  const int64_t p = plan->workers, q = plan->proxies, S = plan->num_pieces();
  // Shard numbering for messages: pieces cut from one leaf are its shards.
  plan->piece_shard.assign(S, 0);
  plan->piece_num_shards.assign(S, 1);
  for (int64_t s = 1; s < S; ++s) {
    const Segment& first = plan->segments[plan->piece_seg_begin[s]];
    const Segment& prev = plan->segments[plan->piece_seg_begin[s] - 1];
    if (first.leaf == prev.leaf) plan->piece_shard[s] = plan->piece_shard[s - 1] + 1;
  }
  for (int64_t s = S - 1; s >= 0; --s) {
    const bool continues = s + 1 < S && plan->piece_shard[s + 1] > 0;
    plan->piece_num_shards[s] =
        continues ? plan->piece_num_shards[s + 1] : plan->piece_shard[s] + 1;
  }

  if (static_cast<int64_t>(plan->piece_push.size()) != S) {
    plan->piece_push.assign(S, 0);
    for (int64_t s = 1; s < S; ++s)
      plan->piece_push[s] = plan->piece_push[s - 1] + (plan->piece_shard[s] == 0 ? 1 : 0);
  }

  // A piece every worker routes to one proxy needs no ring (DENSE).
  plan->piece_holder.assign(S, -1);
  for (int64_t s = 0; s < S; ++s) {
    bool one = true;
    for (int64_t w = 1; w < p; ++w) one = one && plan->dest(s, w) == plan->dest(s, 0);
    if (one) plan->piece_holder[s] = plan->dest(s, 0);
  }

  // Port ranks: pairs (s, w) in ascending order, counted per proxy.
  plan->proxy_port_rank.assign(S * p, 0);
  std::vector<int64_t> served(q, 0);  // (s, w) pairs proxy k serves so far
  for (int64_t s = 0; s < S; ++s)
    for (int64_t w = 0; w < p; ++w) plan->proxy_port_rank[s * p + w] = served[plan->dest(s, w)]++;

  // Proxy storage layout.
  plan->contributors.assign(q * S, {});
  plan->slot_begin.assign(q * S, 0);
  plan->arena_nelems.assign(q, 0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t w = 0; w < p; ++w)
      plan->contributors[plan->dest(s, w) * S + s].push_back(static_cast<int32_t>(w));
  for (int64_t k = 0; k < q; ++k) {
    for (int64_t s = 0; s < S; ++s) {
      plan->slot_begin[k * S + s] = plan->arena_nelems[k];
      const int64_t slots = std::max<int64_t>(1, plan->contributors[k * S + s].size());
      plan->arena_nelems[k] += slots * plan->piece_nelems[s];
    }
  }
}

std::string Plan::DescribePiece(int64_t piece) const {
  const Segment& first = segments[piece_seg_begin[piece]];
  const int64_t nsegs = piece_seg_begin[piece + 1] - piece_seg_begin[piece];
  std::string out = "tensor '" + leaf_names[first.leaf] + "'";
  if (nsegs > 1) out += " (+" + std::to_string(nsegs - 1) + " small tensors batched with it)";
  if (piece_num_shards[piece] > 1)
    out += " [shard " + std::to_string(piece_shard[piece] + 1) + "/" +
           std::to_string(piece_num_shards[piece]) + "]";
  return out + ", piece " + std::to_string(piece);
}

}  // namespace coarse
