// Across hosts (HostsStage, runtime/phases.h): the chunks a proxy owns after
// the reduce-scatter of every piece, to XLA's buffer and back
// (phases/reduce_pieces.cc runs it between its two calls).
#pragma once

#include <cstdint>

#include "runtime/device.h"
#include "runtime/phases.h"
#include "runtime/session.h"

namespace coarse {

// Proxy k's owned chunks of every piece to `hosts.chunks` (`to_hosts`) or
// back from it, laid out by ExchangeRanges; the buffer's tail is zeros.
Status ExchangeOwned(Session& session, Device& dev, int64_t k, const HostsStage& hosts,
                     bool to_hosts);

}  // namespace coarse
