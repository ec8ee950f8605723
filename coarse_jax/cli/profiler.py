"""``python -m coarse_jax.cli``: profile a mesh, plan from it, compare the sync schemes.

The schemes: DENSE, AllReduce and COARSE.

Prints the measured link matrices, each worker's routing table, the
threshold S and shard size S', the dual-sync split m the paper's model
picks, and predicted vs measured sync time of a ResNet-50-shaped gradient
tree for the three schemes. On an emulated board (``--emulate``) it also
puts COARSE with proxies in host memory (COARSE-host) beside COARSE with
proxy devices, AllReduce and DENSE, and names the placement the board
favours (`coarse_jax.cli.proxy_placement`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m coarse_jax.cli", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--proxies",
        type=int,
        default=None,
        help="proxies, dividing --workers (COARSE k:1); default: one per worker",
    )
    parser.add_argument(
        "--emulate",
        choices=["t4", "v100", "p100", "pcie3", "pcie4", "pcie5"],
        default=None,
        help="emulate this interconnect (default: the host's real devices)",
    )
    parser.add_argument(
        "--proxies-on",
        choices=["devices", "host"],
        default="devices",
        help="where the profiled mesh's proxies live (make_mesh(proxies_on=...))",
    )
    parser.add_argument(
        "--no-placements",
        action="store_true",
        help="skip COARSE-host beside COARSE-devices (with --emulate)",
    )
    parser.add_argument(
        "--profile-time-scale",
        type=float,
        default=20.0,
        help="time_scale while profiling the emulated links",
    )
    parser.add_argument(
        "--sync-time-scale",
        type=float,
        default=300.0,
        help="time_scale while timing the sync (emulated links must dominate host costs)",
    )
    parser.add_argument(
        "--clock",
        choices=["real", "virtual"],
        default="real",
        help="emulated links: 'virtual' simulates time (exact, repeatable, no "
        "sleeping), 'real' sleeps so wall time shows the links",
    )
    parser.add_argument("--max-size", type=int, default=4 << 20, help="largest probe size, bytes")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--t-fp-ms", type=float, default=30.0, help="forward time per step for the split m"
    )
    parser.add_argument(
        "--t-bp-ms", type=float, default=60.0, help="backward time per step for the split m"
    )
    parser.add_argument("--save", default=None, help="write the profile as JSON here")
    parser.add_argument("--plot", default=None, help="write the bandwidth plot (PNG) here")
    parser.add_argument("--no-sync", action="store_true", help="skip timing the three schemes")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    # XLA reads this when the CPU backend starts (first device query), so it
    # still takes effect although jax is imported already.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count="
            f"{args.workers + (args.proxies or args.workers)}".strip()
        )

    import coarse_jax as coarse
    from coarse_jax import perf_model
    from coarse_jax.cli import schemes
    from coarse_jax.cli.resnet50 import RESNET50_SHAPES, resnet50_tree
    from coarse_jax.profiling.measure import DEFAULT_SIZES
    from coarse_jax.profiling.routing import shard_bytes_from_profile, threshold_bytes

    p = args.workers
    mesh = coarse.make_mesh(workers=p, proxies=args.proxies, proxies_on=args.proxies_on)
    q = args.proxies or p
    probe_topo = sync_topo = None
    if args.emulate:
        where = {"proxies": q, "proxies_on": args.proxies_on, "clock": args.clock}
        probe_topo = coarse.EmulatedTopology.preset(
            args.emulate, p, time_scale=args.profile_time_scale, **where
        )
        sync_topo = coarse.EmulatedTopology.preset(
            args.emulate, p, time_scale=args.sync_time_scale, **where
        )
    sizes = [s for s in DEFAULT_SIZES if s <= args.max_size]
    prof = coarse.diagnostics.profile(mesh, topology=probe_topo, sizes=sizes, reps=args.reps)
    print(prof.table())
    if args.save:
        prof.save(args.save)
    if args.plot:
        prof.plot(args.plot)

    cfg = coarse.Config.from_profile(prof, topology=sync_topo)
    print("\nrouting table (paper III-E):")
    print(f"{'worker':>6} {'LatProxy':>9} {'BwProxy':>8} {'S (bytes)':>10} {'S_prime':>9}")
    assert cfg.routes is not None  # from_profile sets them
    for i, (lat, bw) in enumerate(cfg.routes):
        s = threshold_bytes(prof, i)
        print(
            f"{i:>6} {lat:>9} {bw:>8} {('-' if s is None else s):>10} "
            f"{shard_bytes_from_profile(prof, i):>9}"
        )
    print(
        f"Config: shard_bytes={cfg.shard_bytes}, "
        f"latency_threshold_bytes={cfg.latency_threshold_bytes}"
    )

    # Dual-sync split: the paper's model with the measured ring bandwidths.
    n = sum(math.prod(shape) * 4 for _, shape in RESNET50_SHAPES)
    # The profile was taken at profile_time_scale; T_FP/T_BP are real time.
    unscale = prof.time_scale
    bw_proxy = float(prof.link("pp", "bandwidth_gbps").mean()) * unscale
    bw_gpu = float(prof.link("ww", "bandwidth_gbps").mean()) * unscale
    boundaries = [0]
    for _, shape in RESNET50_SHAPES:
        boundaries.append(boundaries[-1] + math.prod(shape) * 4)
    m, t_train = perf_model.best_split(
        n,
        p,
        bw_proxy,
        bw_gpu,
        args.t_fp_ms / 1e3,
        args.t_bp_ms / 1e3,
        candidates=[n - b for b in boundaries],
    )
    print(
        f"\ndual sync (T_FP={args.t_fp_ms} ms, T_BP={args.t_bp_ms} ms, "
        f"measured BW_proxy={bw_proxy:.2f} "
        f"GB/s, BW_GPU={bw_gpu:.2f} GB/s): m = {m} of {n} bytes through proxies, "
        f"leading_bytes = {n - m}, predicted T_train = {t_train * 1e3:.1f} ms"
    )
    if args.no_sync:
        return

    tree = resnet50_tree()
    print(
        f"\nsync of a ResNet-50 gradient tree ({n / 2**20:.1f} MiB, {p} workers, {q} proxies"
        + (f", {args.emulate} links x{args.sync_time_scale:g}" if args.emulate else "")
        + "):"
    )
    label = "simulated ms" if args.emulate and args.clock == "virtual" else "measured ms"
    print(f"{'scheme':<10} {label:>12} {'predicted ms':>13}")
    for scheme in schemes.SCHEMES:
        scfg = schemes.scheme_config(scheme, dataclasses.replace(cfg, leading_bytes=0), p)
        measured = schemes.time_sync(mesh, tree, scfg, reps=args.reps)
        predicted = (
            perf_model.predict_plan_sync_s(coarse.diagnostics.plan(tree, mesh, scfg), sync_topo)
            if sync_topo
            else float("nan")
        )
        print(f"{scheme:<10} {measured * 1e3:>12.1f} {predicted * 1e3:>13.1f}")
    if args.emulate and not args.no_placements:
        from coarse_jax.cli import proxy_placement as placement

        rows = placement.compare_placements(
            tree,
            args.emulate,
            p,
            q,
            time_scale=args.sync_time_scale,
            profile_time_scale=args.profile_time_scale,
            clock=args.clock,
            sizes=sizes,
            reps=args.reps,
        )
        print(f"\nproxies as devices or in host memory ({args.emulate}, {p} workers, {q} proxies):")
        print(placement.table(rows, label))
        print(placement.favoured(rows, args.emulate))
