"""`coarse.EmulatedTopology`: an emulated interconnect, enforced inside the runtime's transport.

COARSE's decisions depend on the links between devices (the paper's Fig. 8:
on AWS V100 boxes remote PCIe is *faster* than local, on SDSC P100 boxes it is
slower). CPU devices share one memory, so the runtime emulates links the way
the paper emulated CCI devices: every transfer lasts ``latency + bytes /
bandwidth``, times ``time_scale``, on its directed link, and a link carries one
transfer at a time per direction (full duplex). Worker<->proxy transfers also
share the device's serial-bus port (one transfer in and one out at a time), so
many clients pushing to one proxy (DENSE) queue up as on real hardware.

Bandwidths are GB/s (1e9 bytes/s) per direction, latencies microseconds.

Two clocks. ``clock="real"`` (the default) makes every transfer really last
its emulated time (the runtime sleeps), so a step's wall time shows the links:
for demos and benchmarks, host noise included. ``clock="virtual"`` runs the
same protocol and gives the same results, but time is simulated: each device
keeps its own clock, a transfer is booked from the simulated time its data was
ready and a wait moves the waiter's clock to the arrival, so nothing sleeps.
`coarse.diagnostics.profile` then measures exact, repeatable times, and
`virtual_sync_seconds` reads how long each synchronization took. Host work
(copies, additions) takes no simulated time.

Across hosts (a ``("host", "tier", "data")`` mesh, one process per host) the
matrices describe one host's devices, all hosts alike, and one more link
joins the hosts: each host's network interface (``inter_host_gbps``,
``inter_host_us``), shared by all its devices, full duplex. The runtime
charges it where the hosts' chunks meet after the XLA collective over
"host" (``coarse_host_gather``): on the real clock every device of a host
waits until ``latency + bytes / bandwidth`` (times ``time_scale``) after the
host's own synchronization ended, ``bytes`` being what its NIC must carry
each way, (hosts - 1) times the host's f32 chunks. The collective's own
bytes still move for real (gloo, NCCL); its wall time overlaps the emulated
transfer. The virtual clock does not time the inter-host step.

Proxies in host memory (``make_mesh(..., proxies_on="host")``,
``EmulatedTopology(proxies_on="host")``): the worker<->proxy links are each worker's
PCIe link to the CPU, shared with the other workers on its root
complex (``root_complex_gbps``, ``root_complex_workers``), and a host proxy
has no serial-bus port of its own; both clocks emulate it. The figures and
what is modelled: `coarse_jax.emulation.pcie_link`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from coarse_jax.emulation import pcie_link
from coarse_jax.mesh import local_proxy

Matrix = tuple[tuple[float, ...], ...]
CLOCKS = ("real", "virtual")


def _matrix(value: Any, shape: tuple[int, int], what: str) -> Matrix:
    m = np.asarray(value, dtype=np.float64)
    if m.shape != shape:
        raise ValueError(
            f"EmulatedTopology.{what}: expected a {shape[0]}x{shape[1]} matrix, got shape "
            f"{m.shape}."
        )
    return tuple(tuple(float(v) for v in row) for row in m)


def _local_remote(p: int, q: int, local: float, remote: float) -> Matrix:
    """p x q: entry (i, j) is ``local`` where j is row i's local proxy (`local_proxy`)."""
    return tuple(
        tuple(local if local_proxy(i, p, q) == j else remote for j in range(q)) for i in range(p)
    )


@dataclasses.dataclass(frozen=True)
class EmulatedTopology:
    """Per-link bandwidth (GB/s) and latency (us) for a mesh of ``workers`` workers and proxies.

    Attributes:
      name: a label for tables and plots.
      workers: p.
      worker_proxy_gbps: ``[worker][proxy]`` bandwidths, GB/s (p x q); the same both ways.
      worker_proxy_us: ``[worker][proxy]`` latencies, microseconds.
      proxy_proxy_gbps: ``[proxy][proxy]`` bandwidths, q x q (the diagonal is unused).
      proxy_proxy_us: ``[proxy][proxy]`` latencies.
      worker_worker_gbps: ``[worker][worker]`` bandwidths (used by the worker ring).
      worker_worker_us: ``[worker][worker]`` latencies.
      inter_host_gbps: each host's network link to the others, GB/s (one per
        host, shared by its devices, the same both ways), used only on a mesh
        across hosts; see the module docstring.
      inter_host_us: that link's latency.
      time_scale: every emulated duration is multiplied by this, so emulated
        links can be made slow enough to dominate the host's own copy costs.
      clock: "real" (transfers sleep; wall time shows the links) or
        "virtual" (simulated time, exact and repeatable; see the module docstring).
      proxies: q, dividing p (COARSE k:1, `coarse.make_mesh`); 0 (the
        default) means p.
      proxies_on: "devices" (the default) or "host", as the mesh's
        (``coarse.make_mesh(..., proxies_on=...)``). With "host",
        ``worker_proxy_*`` are the workers' PCIe links (the same to every
        host proxy, as every host proxy is reached over the one link), a host
        proxy has no port of its own, and the links share a root complex.
      root_complex_gbps: with host proxies, the aggregate bandwidth per
        direction of one root complex, shared by its workers' PCIe links:
        each runs at ``min(link, root_complex_gbps / workers on it)``
        (`effective_worker_proxy_gbps`). ``math.inf`` (the default): no cap.
      root_complex_workers: workers per root complex, consecutive (worker i
        on root complex ``i // root_complex_workers``); 0 (the default): all.

    Raises:
      ValueError: ``workers`` is not a positive int, ``proxies`` does not
        divide it, a matrix has the wrong shape, a
        bandwidth is not positive, a latency is negative, ``time_scale`` is not
        positive, ``clock`` is neither "real" nor "virtual", ``proxies_on``
        is neither "devices" nor "host", or a root complex is given with
        device proxies.

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", workers=4)
      >>> cfg = coarse.Config(topology=topo)          # every coarse sync on these links
      >>> own = coarse.EmulatedTopology(
      ...     "flat", 2,
      ...     worker_proxy_gbps=[[10, 10], [10, 10]], worker_proxy_us=[[2, 2], [2, 2]],
      ...     proxy_proxy_gbps=[[1, 20], [20, 1]], proxy_proxy_us=[[0, 1], [1, 0]],
      ...     worker_worker_gbps=[[1, 9], [9, 1]], worker_worker_us=[[0, 8], [8, 0]],
      ...     clock="virtual")
      >>> own.transfer_s("wp", 0, 1, 10e9)            # 10 GB at 10 GB/s, plus 2 us
      1.000002
    """

    name: str
    workers: int
    worker_proxy_gbps: Matrix
    worker_proxy_us: Matrix
    proxy_proxy_gbps: Matrix
    proxy_proxy_us: Matrix
    worker_worker_gbps: Matrix
    worker_worker_us: Matrix
    time_scale: float = 1.0
    clock: str = "real"
    # 100 Gb/s (12.5 GB/s) and 5 us: an assumption (a 100 GbE / EDR-class NIC
    # per host, RDMA-like latency), the same in every preset.
    inter_host_gbps: float = 12.5
    inter_host_us: float = 5.0
    proxies: int = 0
    proxies_on: str = "devices"
    root_complex_gbps: float = math.inf
    root_complex_workers: int = 0

    def __post_init__(self) -> None:
        p = self.workers
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"EmulatedTopology.workers: expected a positive int, got {p!r}.")
        q = self.proxies or p
        if isinstance(q, bool) or not isinstance(q, int) or q < 1 or q > p or p % q:
            raise ValueError(
                f"EmulatedTopology.proxies: expected a positive int dividing workers={p}, got "
                f"{self.proxies!r}."
            )
        object.__setattr__(self, "proxies", q)
        shapes = {"worker_proxy": (p, q), "proxy_proxy": (q, q), "worker_worker": (p, p)}
        for field in dataclasses.fields(self):
            if field.name.endswith(("_gbps", "_us")) and not field.name.startswith(
                ("inter_host", "root_complex")
            ):
                shape = shapes[field.name.rsplit("_", 1)[0]]
                m = _matrix(getattr(self, field.name), shape, field.name)
                arr = np.asarray(m)
                off_diagonal = (
                    ~np.eye(shape[0], dtype=bool)
                    if not field.name.startswith("worker_proxy")
                    else None
                )
                values = arr if off_diagonal is None else arr[off_diagonal]
                if field.name.endswith("_gbps") and not (values > 0).all():
                    raise ValueError(f"EmulatedTopology.{field.name}: bandwidths must be > 0 GB/s.")
                if field.name.endswith("_us") and not (values >= 0).all():
                    raise ValueError(f"EmulatedTopology.{field.name}: latencies must be >= 0 us.")
                object.__setattr__(self, field.name, m)
        for name in ("inter_host_gbps", "inter_host_us"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"EmulatedTopology.{name}: expected a number, got {v!r}.")
            object.__setattr__(self, name, float(v))
        if not self.inter_host_gbps > 0:
            raise ValueError(
                "EmulatedTopology.inter_host_gbps: bandwidths must be > 0 GB/s, got "
                f"{self.inter_host_gbps!r} (100 Gb/s is 12.5 GB/s)."
            )
        if not self.inter_host_us >= 0:
            raise ValueError(
                "EmulatedTopology.inter_host_us: latencies must be >= 0 us, got "
                f"{self.inter_host_us!r}."
            )
        if not self.time_scale > 0:
            raise ValueError(f"EmulatedTopology.time_scale: expected > 0, got {self.time_scale!r}.")
        pcie_link.check_placement(
            self.proxies_on, self.root_complex_gbps, self.root_complex_workers
        )
        object.__setattr__(self, "root_complex_gbps", float(self.root_complex_gbps))
        if self.clock not in CLOCKS:
            raise ValueError(
                f"EmulatedTopology.clock: expected one of {CLOCKS}, got {self.clock!r}; "
                '"virtual" simulates time (exact, repeatable), "real" sleeps.'
            )

    @staticmethod
    def preset(
        name: str,
        workers: int,
        *,
        proxies: int | None = None,
        proxies_on: str = "devices",
        time_scale: float = 1.0,
        clock: str = "real",
    ) -> EmulatedTopology:
        """An interconnect from the paper (Section III-E, Fig. 8) or a PCIe generation.

        A worker's *local* proxy is the one of its group (proxy ``i // k``,
        k = workers / proxies, as `coarse.make_mesh` pairs them); every other
        proxy is remote to it.

        * ``"t4"``: local = remote (12 GB/s, 5 us worker<->proxy).
        * ``"v100"``: AWS p3 PCIe "anti-locality": local 9 GB/s (3 us), remote
          16 GB/s (8 us): small tensors go local, large ones remote.
        * ``"p100"``: SDSC PCIe: local 25 GB/s (3 us), remote 18 GB/s (8 us).
        * ``"pcie3"``, ``"pcie4"``, ``"pcie5"``: an x16 link of that PCIe
          generation, 12.5, 25 and 50 GB/s, 2 us, between every worker and
          proxy device and between workers (peer to peer, 8 us).

        The paper gives worker<->proxy bandwidths only; the rest are this
        project's assumptions, the same in every preset so that presets differ
        only where the paper's machines do: proxy<->proxy (the CCI) 24 GB/s,
        2 us; worker<->worker (PCIe peer-to-peer through the host, where
        AllReduce runs) 9 GB/s, 8 us; across hosts, each host's network link
        100 Gb/s (12.5 GB/s), 5 us (``inter_host_gbps``, ``inter_host_us``).

        With ``proxies_on="host"`` (a mesh of ``make_mesh(...,
        proxies_on="host")``) the proxies are host memory: each worker
        reaches every proxy over its PCIe link, the preset's PCIe generation
        (the paper's boards are Gen3: pcie3), two workers share one root
        complex of one x16 link's bandwidth, and proxy<->proxy copies run in
        host memory (20 GB/s, 1 us); the worker<->worker links stay the
        preset's. Figures and sources: `coarse_jax.emulation.pcie_link`.

        Args:
          name: "t4", "v100", "p100", "pcie3", "pcie4" or "pcie5".
          workers: p.
          proxies: q, dividing p; default p (COARSE 1:1).
          proxies_on: "devices" (proxy devices) or "host" (proxies in host memory).
          time_scale: multiplies every emulated duration.
          clock: "real" or "virtual" (see the module docstring).

        Returns:
          A `EmulatedTopology` named after the preset ("v100+host" with host proxies).

        Raises:
          ValueError: an unknown preset name or placement, or ``proxies``
            not dividing ``workers``.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, time_scale=300, clock="virtual")
          >>> topo.worker_proxy_gbps[0][0], topo.worker_proxy_gbps[0][1]   # local, remote
          (9.0, 16.0)
          >>> host = coarse.EmulatedTopology.preset("pcie4", 4, proxies=2, proxies_on="host")
          >>> host.name, host.worker_proxy_gbps[0], host.root_complex_gbps
          ('pcie4+host', (25.0, 25.0), 25.0)
          >>> host.effective_worker_proxy_gbps()[0]     # two workers share the root complex
          (12.5, 12.5)
        """
        boards = {
            "t4": ((12.0, 5.0), (12.0, 5.0)),
            "v100": ((9.0, 3.0), (16.0, 8.0)),
            "p100": ((25.0, 3.0), (18.0, 8.0)),
        }
        names = sorted(boards) + sorted(pcie_link.PCIE)
        if name not in names:
            raise ValueError(f"EmulatedTopology.preset: name must be one of {names}, got {name!r}.")
        if proxies_on not in pcie_link.PLACEMENTS:
            raise ValueError(
                f"EmulatedTopology.preset: proxies_on must be one of {pcie_link.PLACEMENTS}, got "
                f"{proxies_on!r}; pass the mesh's (coarse_jax.mesh.proxies_on(mesh))."
            )
        p = workers
        q = p if proxies is None else proxies
        if isinstance(q, bool) or not isinstance(q, int) or q < 1 or p % q:
            raise ValueError(
                "EmulatedTopology.preset: proxies must be a positive int dividing "
                f"workers={p}, got "
                f"{proxies!r}."
            )
        gen = pcie_link.BOARD_PCIE.get(name, name)
        pcie_bw, pcie_us = pcie_link.PCIE[gen]
        (local_bw, local_us), (remote_bw, remote_us) = boards.get(
            name, ((pcie_bw, pcie_us), (pcie_bw, pcie_us))
        )
        ww_bw, ww_us = (9.0, 8.0) if name in boards else (pcie_bw, 8.0)
        pp_bw, pp_us = 24.0, 2.0
        extra: dict[str, Any] = {}
        if proxies_on == "host":
            local_bw = remote_bw = pcie_bw
            local_us = remote_us = pcie_us
            pp_bw, pp_us = pcie_link.HOST_MEMORY
            extra = {
                "proxies_on": "host",
                "root_complex_gbps": pcie_bw,
                "root_complex_workers": pcie_link.ROOT_COMPLEX_WORKERS,
            }
        return EmulatedTopology(
            name=name + ("+host" if proxies_on == "host" else ""),
            workers=p,
            worker_proxy_gbps=_local_remote(p, q, local_bw, remote_bw),
            worker_proxy_us=_local_remote(p, q, local_us, remote_us),
            proxy_proxy_gbps=_local_remote(q, q, pp_bw, pp_bw),
            proxy_proxy_us=_local_remote(q, q, pp_us, pp_us),
            worker_worker_gbps=_local_remote(p, p, ww_bw, ww_bw),
            worker_worker_us=_local_remote(p, p, ww_us, ww_us),
            time_scale=time_scale,
            clock=clock,
            proxies=q,
            **extra,
        )

    def effective_worker_proxy_gbps(self) -> Matrix:
        """``worker_proxy_gbps`` as transfers see it: with host proxies, the root complex shared.

        Returns:
          The p x q matrix: ``worker_proxy_gbps`` with device proxies; with
          host proxies entry (i, k) is ``min(worker_proxy_gbps[i][k],
          root_complex_gbps / n)``, n the workers on worker i's root complex.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("pcie3", 3, proxies=1, proxies_on="host")
          >>> topo.effective_worker_proxy_gbps()      # workers 0, 1 share; worker 2 alone
          ((6.25,), (6.25,), (12.5,))
        """
        if self.proxies_on != "host":
            return self.worker_proxy_gbps
        sharing = pcie_link.group_sizes(self.workers, self.root_complex_workers)
        return tuple(
            tuple(pcie_link.shared_gbps(bw, self.root_complex_gbps, sharing[i]) for bw in row)
            for i, row in enumerate(self.worker_proxy_gbps)
        )

    def link(self, kind: str, a: int, b: int) -> tuple[float, float]:
        """``(seconds per byte, latency seconds)`` of one link, time_scale applied.

        Args:
          kind: "wp" (indexed [worker][proxy], both directions; with host
            proxies the worker's PCIe link, its root complex shared), "pp" or "ww".
          a: the first index (worker, or sending proxy / worker).
          b: the second index (proxy, or receiving proxy / worker).

        Returns:
          ``(seconds per byte, latency in seconds)``.

        Raises:
          KeyError: an unknown ``kind``.

        Example:
          >>> s_per_byte, latency = coarse.EmulatedTopology.preset("t4", 2).link("wp", 0, 1)
          >>> round(1 / s_per_byte / 1e9, 6), round(latency * 1e6, 6)       # 12 GB/s, 5 us
          (12.0, 5.0)
        """
        bw, us = {
            "wp": (self.effective_worker_proxy_gbps(), self.worker_proxy_us),
            "pp": (self.proxy_proxy_gbps, self.proxy_proxy_us),
            "ww": (self.worker_worker_gbps, self.worker_worker_us),
        }[kind]
        return self.time_scale / (bw[a][b] * 1e9), self.time_scale * us[a][b] * 1e-6

    def transfer_s(self, kind: str, src: int, dst: int, nbytes: float) -> float:
        """Emulated seconds for one transfer of ``nbytes``: latency + bytes / bandwidth.

        Args:
          kind: "wp", "pp" or "ww" (as for `link`).
          src: the sending device's index.
          dst: the receiving device's index.
          nbytes: bytes moved.

        Returns:
          Seconds, ``time_scale`` applied.

        Example:
          >>> round(coarse.EmulatedTopology.preset("v100", 4).transfer_s("wp", 0, 1, 16e9), 6)
          1.000008
          >>> host = coarse.EmulatedTopology.preset("pcie5", 4, proxies_on="host")  # PCIe link:
          >>> round(host.transfer_s("wp", 0, 3, 25e9), 6)     # 50 GB/s shared by two, 2 us
          1.000002
        """
        s_per_byte, latency = self.link(kind, src, dst)
        return latency + nbytes * s_per_byte

    def inter_host_s(self, nbytes: float) -> float:
        """Emulated seconds for ``nbytes`` each way through one host's network link.

        Args:
          nbytes: bytes the host's link carries each way.

        Returns:
          ``time_scale * (inter_host_us * 1e-6 + nbytes / (inter_host_gbps * 1e9))``.

        Example:
          >>> coarse.EmulatedTopology.preset("v100", 4).inter_host_s(12.5e9)   # 100 Gb/s, 5 us
          1.000005
        """
        return self.time_scale * (self.inter_host_us * 1e-6 + nbytes / (self.inter_host_gbps * 1e9))

    def inter_host_attrs(self) -> dict[str, Any]:
        """The inter-host link as FFI attributes of ``coarse_host_gather`` (scaled; real clock).

        Returns:
          A dict of numpy scalars (seconds per byte, latency seconds, and
          whether the clock is virtual).

        Example:
          >>> attrs = coarse.EmulatedTopology.preset("v100", 4).inter_host_attrs()
          >>> round(float(attrs["emu_host_latency_s"]) * 1e6, 6)             # 5 us
          5.0
        """
        return {
            "emu_host_s_per_byte": np.float64(self.time_scale / (self.inter_host_gbps * 1e9)),
            "emu_host_latency_s": np.float64(self.time_scale * self.inter_host_us * 1e-6),
            "emu_virtual": np.int64(self.clock == "virtual"),
        }

    def ffi_attrs(self) -> dict[str, Any]:
        """The topology as FFI attributes: seconds per byte and seconds, scaled, and the clock.

        With host proxies the worker<->proxy rates are the shared ones
        (`effective_worker_proxy_gbps`) and ``emu_host_proxies`` is 1: the
        runtime books only the worker's port of such a transfer.

        Returns:
          A dict from attribute name to a numpy array (per link) or scalar.

        Example:
          >>> attrs = coarse.EmulatedTopology.preset("v100", 4, clock="virtual").ffi_attrs()
          >>> attrs["emu_wp_latency_s"].shape, int(attrs["emu_virtual"])
          ((16,), 1)
          >>> host = coarse.EmulatedTopology.preset("pcie4", 4, proxies=2, proxies_on="host")
          >>> host = host.ffi_attrs()
          >>> round(1 / float(host["emu_wp_s_per_byte"][0]) / 1e9, 6), int(host["emu_host_proxies"])
          (12.5, 1)
        """
        scale = self.time_scale

        def rate(m: Matrix) -> np.ndarray:  # seconds per byte
            return (scale / (np.asarray(m, np.float64) * 1e9)).reshape(-1)

        def lat(m: Matrix) -> np.ndarray:
            return (scale * np.asarray(m, np.float64) * 1e-6).reshape(-1)

        attrs = {
            "emu_wp_s_per_byte": rate(self.effective_worker_proxy_gbps()),
            "emu_wp_latency_s": lat(self.worker_proxy_us),
            "emu_pp_s_per_byte": rate(self.proxy_proxy_gbps),
            "emu_pp_latency_s": lat(self.proxy_proxy_us),
            "emu_ww_s_per_byte": rate(self.worker_worker_gbps),
            "emu_ww_latency_s": lat(self.worker_worker_us),
            "emu_virtual": np.int64(self.clock == "virtual"),
        }
        if self.proxies_on == "host":
            # Host proxies have no serial-bus port: only the worker's is booked.
            attrs["emu_host_proxies"] = np.int64(1)
        return attrs
