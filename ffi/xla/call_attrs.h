// The typed attributes of the sync calls (coarse_begin, coarse_push,
// coarse_proxy_ring, coarse_opt_count, coarse_worker_ring, coarse_pull): the
// one place C++ names them. Each is bound with XLA FFI's typed attribute
// decoding (`.Attr<CallAttrs>("call")` and the call's own `.Attr<T>`s,
// cpu/handlers_cpu.cc and cuda/handlers_cuda.cc), so XLA checks every name
// and type before a handler runs: a missing, extra or mistyped attribute
// fails the call with XLA's message naming it. The Python side that writes
// them is coarse_jax/_ffi/calls.py (`_call_attrs`), the one place there.
//
// The set is fixed: what a call may lack is passed empty (no emulated links:
// empty topology tables; no optimizer, a value_and_grad's sync: store -1).
#pragma once

#include <cstdint>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace coarse {

// The emulated links (coarse.Topology.ffi_attrs): float64 tables, p x q
// (worker -> proxy), q x q and p x p, each seconds per byte and latency;
// all empty when links are not emulated.
struct TopologyAttrs {
  xla::ffi::Span<const double> wp_s_per_byte, wp_latency_s;
  xla::ffi::Span<const double> pp_s_per_byte, pp_latency_s;
  xla::ffi::Span<const double> ww_s_per_byte, ww_latency_s;
  bool virtual_clock;  // the emulator's virtual clock (emu_virtual)
  bool host_proxies;   // the proxies are in host memory (emu_host_proxies)
};

// The plan (coarse_jax.plan.Plan.ffi_attrs), parsed once per plan_key
// (xla/plan_attrs.h GetPlan).
struct PlanAttrs {
  int64_t plan_key;                            // hash of the rest (the plan cache's key)
  int64_t workers;                             // p
  int64_t proxies;                             // q, dividing p
  int64_t timeout_ms;                          // Config.timeout_s
  bool mean;                                   // average (else sum) the gradients
  int64_t num_proxy_leaves;                    // leaves [0, this) go through the proxies
  xla::ffi::Span<const int64_t> piece_nelems;  // [S]
  xla::ffi::Span<const int64_t> piece_nbytes;  // [S]
  int64_t leading_nbytes;                      // the worker ring's bytes
  xla::ffi::Span<const int64_t> piece_dest;    // [S * p]: the proxy of each (piece, worker)
  xla::ffi::Span<const int64_t> segments;      // [5 * G]: leaf, leaf_off, len, piece, piece_off
  xla::ffi::Span<const int64_t> leaf_nelems;   // [L], sync order
  xla::ffi::Span<const int64_t> piece_push;    // [S]: the push (bucket) each piece is in
  std::string_view leaf_names;                 // '\n'-separated, sync order
  bool trace;                                  // Config(trace=True)
  TopologyAttrs topology;
};

// A coarse.value_and_update's optimizer and its store (coarse_jax/optim.py,
// coarse_jax/api/_stores.py; xla/optimizer_attrs.h reads it); store -1:
// none, the other members are then unread.
struct OptimizerAttrs {
  int64_t store;          // the store's id
  std::string_view name;  // names the store in errors
  int64_t kind;           // 0 sgd, 1 adam, 2 adamw
  double b1, b2, eps, one_minus_b1, one_minus_b2, weight_decay, momentum, clip_norm;
  bool nesterov;
  xla::ffi::Span<const int64_t> leaf_flags;  // per plan leaf (runtime/param_store.h)
  int64_t snapshot_every;                    // Config.snapshot_every
  bool check_params;                         // BeginUpdate checks the params (xla/proxy_ring.cc)
  bool delayed;                              // OptimizerSpec::delayed
};

// What every sync call carries, attribute "call".
struct CallAttrs {
  PlanAttrs plan;
  OptimizerAttrs optimizer;
  int64_t site;                            // which coarse sync of the program
  xla::ffi::Span<const int64_t> ordinals;  // [p + q]: each mesh device's platform number
  bool push_in_place;                      // the proxies read the pushes in place
  bool across_hosts;                       // the proxies' ring sums over the hosts
  bool last;                               // this call ends the step on its device
};

}  // namespace coarse

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    ::coarse::TopologyAttrs,
    ::xla::ffi::StructMember<::xla::ffi::Span<const double>>("wp_s_per_byte"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const double>>("wp_latency_s"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const double>>("pp_s_per_byte"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const double>>("pp_latency_s"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const double>>("ww_s_per_byte"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const double>>("ww_latency_s"),
    ::xla::ffi::StructMember<bool>("virtual_clock"),
    ::xla::ffi::StructMember<bool>("host_proxies"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    ::coarse::PlanAttrs, ::xla::ffi::StructMember<int64_t>("plan_key"),
    ::xla::ffi::StructMember<int64_t>("workers"), ::xla::ffi::StructMember<int64_t>("proxies"),
    ::xla::ffi::StructMember<int64_t>("timeout_ms"), ::xla::ffi::StructMember<bool>("mean"),
    ::xla::ffi::StructMember<int64_t>("num_proxy_leaves"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("piece_nelems"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("piece_nbytes"),
    ::xla::ffi::StructMember<int64_t>("leading_nbytes"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("piece_dest"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("segments"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("leaf_nelems"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("piece_push"),
    ::xla::ffi::StructMember<std::string_view>("leaf_names"),
    ::xla::ffi::StructMember<bool>("trace"),
    ::xla::ffi::StructMember<::coarse::TopologyAttrs>("topology"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    ::coarse::OptimizerAttrs, ::xla::ffi::StructMember<int64_t>("store"),
    ::xla::ffi::StructMember<std::string_view>("name"), ::xla::ffi::StructMember<int64_t>("kind"),
    ::xla::ffi::StructMember<double>("b1"), ::xla::ffi::StructMember<double>("b2"),
    ::xla::ffi::StructMember<double>("eps"), ::xla::ffi::StructMember<double>("one_minus_b1"),
    ::xla::ffi::StructMember<double>("one_minus_b2"),
    ::xla::ffi::StructMember<double>("weight_decay"), ::xla::ffi::StructMember<double>("momentum"),
    ::xla::ffi::StructMember<double>("clip_norm"), ::xla::ffi::StructMember<bool>("nesterov"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("leaf_flags"),
    ::xla::ffi::StructMember<int64_t>("snapshot_every"),
    ::xla::ffi::StructMember<bool>("check_params"), ::xla::ffi::StructMember<bool>("delayed"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    ::coarse::CallAttrs, ::xla::ffi::StructMember<::coarse::PlanAttrs>("plan"),
    ::xla::ffi::StructMember<::coarse::OptimizerAttrs>("optimizer"),
    ::xla::ffi::StructMember<int64_t>("site"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int64_t>>("ordinals"),
    ::xla::ffi::StructMember<bool>("push_in_place"), ::xla::ffi::StructMember<bool>("across_hosts"),
    ::xla::ffi::StructMember<bool>("last"));
