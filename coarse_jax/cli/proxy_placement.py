"""Where the proxies go: COARSE-devices beside COARSE-host, AllReduce and DENSE, on one board.

For an emulated board (`coarse.EmulatedTopology.preset`), p workers and q proxies:

* ``DENSE``: every worker pushes to and pulls from proxy device 0;
* ``AllReduce``: the workers' ring (no proxies);
* ``COARSE-devices``: COARSE with q proxy devices
  (``make_mesh(workers=p, proxies=q)``, p + q devices), routed from a
  profile of that mesh;
* ``COARSE-host``: COARSE with q proxies in host memory
  (``make_mesh(workers=p, proxies=q, proxies_on="host")``, p devices, the
  preset's PCIe link, `coarse_jax.emulation.pcie_link`), routed from a
  profile of that mesh.

Each row has the model's time (`coarse.perf_model.predict_plan_sync_s`) and,
when run, the time the runtime took on the emulated links (on the virtual
clock: simulated, exact; on the real clock: wall time, host noise included).
`favoured` names the placement with the shorter COARSE time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from coarse_jax.cli import schemes
from coarse_jax.config import Config
from coarse_jax.emulation.topology import EmulatedTopology
from coarse_jax.mesh import check_mesh, make_mesh
from coarse_jax.perf_model import predict_plan_sync_s
from coarse_jax.plan import plan as make_plan
from coarse_jax.profiling.measure import profile


@dataclasses.dataclass(frozen=True)
class PlacementRow:
    """One scheme on one placement: seconds predicted and, if run, taken.

    Attributes:
      scheme: "DENSE", "AllReduce", "COARSE-devices" or "COARSE-host".
      predicted_s: the model's seconds.
      taken_s: the runtime's seconds on the emulated links, or None when not run.
    """

    scheme: str
    predicted_s: float
    taken_s: float | None


def compare_placements(
    shapes: Any,
    preset: str,
    workers: int,
    proxies: int,
    *,
    time_scale: float = 300.0,
    profile_time_scale: float = 20.0,
    clock: str = "virtual",
    sizes: Sequence[int] = (1 << 10, 1 << 16, 1 << 22),
    reps: int = 3,
    run: bool = True,
) -> list[PlacementRow]:
    """The four rows of the module docstring for a tree shaped like ``shapes``.

    Needs ``workers + proxies`` devices (the device-proxy mesh). With
    ``run=False`` nothing is synchronized: only the model's times (the routes
    still come from profiles of the two meshes).
    """
    p, q = workers, proxies
    rows = []
    configs = {}
    for placement in ("devices", "host"):
        # Their tiers, fixed now: the two meshes are one jax object (the same workers).
        mesh = check_mesh(make_mesh(workers=p, proxies=q, proxies_on=placement), "placement")
        topo = EmulatedTopology.preset(preset, p, proxies=q, proxies_on=placement, clock=clock)
        probe = dataclasses.replace(topo, time_scale=profile_time_scale)
        prof = profile(mesh, topology=probe, sizes=sizes, reps=max(2, reps))
        sync_topo = dataclasses.replace(topo, time_scale=time_scale)
        configs[placement] = (mesh, sync_topo, Config.from_profile(prof, topology=sync_topo))
    dev_mesh, dev_topo, dev_cfg = configs["devices"]
    cases = [
        ("DENSE", dev_mesh, dev_topo, schemes.scheme_config("dense", dev_cfg, p)),
        ("AllReduce", dev_mesh, dev_topo, schemes.scheme_config("allreduce", dev_cfg, p)),
        ("COARSE-devices", dev_mesh, dev_topo, dataclasses.replace(dev_cfg, leading_bytes=0)),
    ]
    host_mesh, host_topo, host_cfg = configs["host"]
    cases.append(
        ("COARSE-host", host_mesh, host_topo, dataclasses.replace(host_cfg, leading_bytes=0))
    )
    for name, mesh, topo, cfg in cases:
        predicted = predict_plan_sync_s(make_plan(shapes, mesh, cfg), topo)
        taken = schemes.time_sync(mesh, shapes, cfg, reps=reps) if run else None
        rows.append(PlacementRow(name, predicted, taken))
    return rows


def favoured(rows: Sequence[PlacementRow], preset: str) -> str:
    """One line: which placement the board favours for COARSE, and by how much.

    Decided on the runtime's times where the rows have them, else on the model's.

    Example:
      >>> from coarse_jax.cli.proxy_placement import PlacementRow, favoured
      >>> rows = [PlacementRow("COARSE-devices", 2.0, None), PlacementRow("COARSE-host", 1.0, None)]
      >>> print(favoured(rows, "pcie4"))
      pcie4 favours host proxies by 100.0%: COARSE-host 1000.0 ms
      vs COARSE-devices 2000.0 ms (predicted)
    """
    by = {r.scheme: r for r in rows}
    dev, host = by["COARSE-devices"], by["COARSE-host"]
    ran = dev.taken_s is not None and host.taken_s is not None
    t_dev = dev.taken_s if ran else dev.predicted_s
    t_host = host.taken_s if ran else host.predicted_s
    assert t_dev is not None and t_host is not None
    how = "emulated" if ran else "predicted"
    if t_host == t_dev:
        return f"{preset}: both placements take {t_dev * 1e3:.1f} ms ({how})"
    (win, t_win), (lose, t_lose) = sorted(
        [("host", t_host), ("devices", t_dev)], key=lambda x: x[1]
    )
    by_pct = (t_lose / t_win - 1) * 100
    return (
        f"{preset} favours {'host proxies' if win == 'host' else 'device proxies'} by "
        f"{by_pct:.1f}%: COARSE-{win} {t_win * 1e3:.1f} ms vs COARSE-{lose} {t_lose * 1e3:.1f} ms "
        f"({how})"
    )


def table(rows: Sequence[PlacementRow], taken_label: str = "simulated ms") -> str:
    """The rows as text: scheme, taken, predicted (ms)."""
    lines = [f"{'scheme':<15} {taken_label:>13} {'predicted ms':>13}"]
    for r in rows:
        taken = "-" if r.taken_s is None else f"{r.taken_s * 1e3:.1f}"
        lines.append(f"{r.scheme:<15} {taken:>13} {r.predicted_s * 1e3:>13.1f}")
    return "\n".join(lines)
