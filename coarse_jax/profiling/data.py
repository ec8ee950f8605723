"""`Profile`: link measurements of one mesh, saved and loaded as JSON.

The paper's profiler (Section III-E, "Dynamic Partitioning") measures, for every
client (worker), the latency and bandwidth to each proxy. `Profile` holds those
measurements; `coarse_jax.profiling.routing` turns them into routes, the
threshold S and the shard size S'; `coarse_jax.profiling.report` prints and
plots them; `coarse_jax.profiling.measure` takes them. The kinds of link and
the figures read from their times are `coarse_jax.profiling.links`.

Units: times are seconds, sizes bytes, latencies microseconds, bandwidths GB/s
(1e9 bytes/s), as in `coarse.EmulatedTopology`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from coarse_jax.mesh import local_proxy
from coarse_jax.profiling import file_format, report
from coarse_jax.profiling.decision import Decision, checked_decisions
from coarse_jax.profiling.file_format import FORMAT as FORMAT  # the tag, read by tests
from coarse_jax.profiling.links import (
    FIGURES,
    LINK_KINDS,
    TIME_FIELDS,
    checked_layout,
    checked_spread,
    checked_times,
    figure,
)


@dataclasses.dataclass(frozen=True, eq=False)
class Profile:
    """Measured transfer times of one mesh's links: ``p`` workers and ``q`` proxies.

    ``q`` is ``p`` at COARSE 1:1; at COARSE k:1 (``coarse.make_mesh(workers=p,
    proxies=q)``, k = p / q) worker ``i``'s local proxy is ``i // k``
    (`local_proxy`). Every time array's last axis follows ``sizes``. Ring
    arrays have shape ``[q, 2, S]`` (``pp_*``, the q proxies' ring) or
    ``[p, 2, S]`` (``ww_*``, the p workers' ring): index 0 of the middle axis
    is the link from device ``k`` to its ring neighbour ``(k + 1) % n``,
    index 1 to ``(k - 1) % n`` (n = q or p). A ring of one device moves
    nothing: its entries are a placeholder 1 ns.

    Equality: ``==`` compares every field exactly (arrays with
    ``np.array_equal``); use `allclose` to compare measurements up to a
    tolerance (e.g. after a JSON round trip through other tools). Profiles are
    not hashable (they hold arrays); the arrays are read-only.

    Attributes:
      workers: p.
      sizes: transfer sizes measured, bytes, strictly ascending.
      wp_oneway_s: ``[p, q, S]`` seconds to move ``sizes[j]`` bytes from
        worker ``i`` to proxy ``k``, one direction (from `coarse.diagnostics.profile`:
        the median over the rounds that measured the link).
      wp_bidir_s: ``[p, q, S]`` seconds until both a push worker ``i`` -> proxy
        ``k`` and a pull proxy ``k`` -> worker ``i`` of that size, run
        concurrently, are done.
      pp_oneway_s: ``[q, 2, S]`` proxy ``k`` to its ring neighbours, one direction.
      pp_bidir_s: ``[q, 2, S]`` proxy ``k`` to and from its ring neighbours, concurrently.
      ww_oneway_s: ``[p, 2, S]`` worker ``k`` to its ring neighbours (the
        workers' AllReduce ring), one direction.
      topology: name of the emulated topology measured, ``None`` for the host's
        real devices.
      time_scale: the emulated topology's ``time_scale`` during the
        measurement. Times are stored as measured (wall clock), not divided by it.
      host: free text describing where it was measured.
      wp_spread: ``[p, q, S]`` how noisy each ``wp_oneway_s`` measurement was:
        the median repetition's excess over the fastest, relative to it
        (outliers dropped; `coarse_jax.profiling.measure.robust_time`); ``None`` when
        unknown (a profile written by hand or by an older version). A profile
        without ``decisions`` is routed treating links whose difference is
        within this noise as tied.
      proxies: q, dividing p; ``0`` or ``None`` (the default, and what a
        profile saved before COARSE k:1 implies) mean p.
      decisions: the routing decisions `coarse.diagnostics.profile` made from its
        repeated, interleaved measurements, one `Decision` per worker and
        kind (latency proxy, bandwidth proxy, threshold), each saying whether
        the measurements made it clear or it kept the model's (or the local)
        choice; routing follows them. ``None`` (a profile written by hand or
        by an older version): routing decides from ``wp_oneway_s`` alone
        (`coarse_jax.profiling.routing`). They are made when the profile is
        measured: a copy with other times (``dataclasses.replace``) should
        set ``decisions=None``.

    Raises:
      ValueError: a field with the wrong shape, order or range (the message
        names the field, what was expected and what it got).
      TypeError: ``host`` is not a str.

    Example:
      >>> import os, tempfile
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
      >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
      >>> path = os.path.join(tempfile.mkdtemp(), "v100.json")
      >>> prof.save(path)
      >>> coarse.diagnostics.Profile.load(path) == prof
      True
      >>> cfg = coarse.Config.from_profile(prof, leading_bytes=64 << 10)
      >>> shared = coarse.make_mesh(workers=4, proxies=2)            # COARSE(2:1)
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, proxies=2, clock="virtual")
      >>> prof = coarse.diagnostics.profile(shared, topology=topo, sizes=[1 << 10, 1 << 20])
      >>> prof.proxies, prof.wp_oneway_s.shape, prof.pp_oneway_s.shape
      (2, (4, 2, 2), (2, 2, 2))
    """

    workers: int
    sizes: tuple[int, ...]
    wp_oneway_s: np.ndarray
    wp_bidir_s: np.ndarray
    pp_oneway_s: np.ndarray
    pp_bidir_s: np.ndarray
    ww_oneway_s: np.ndarray
    topology: str | None = None
    time_scale: float = 1.0
    host: str = ""
    wp_spread: np.ndarray | None = None
    proxies: int = 0
    decisions: tuple[Decision, ...] | None = None

    def __post_init__(self) -> None:
        p, q, sizes = checked_layout(self.workers, self.proxies, self.sizes)
        object.__setattr__(self, "workers", p)
        object.__setattr__(self, "proxies", q)
        object.__setattr__(self, "sizes", sizes)
        for name, kind in TIME_FIELDS:
            arr = checked_times(name, kind, getattr(self, name), p, q, len(sizes))
            object.__setattr__(self, name, arr)
        if self.topology is not None and not isinstance(self.topology, str):
            raise ValueError(
                f"Profile.topology: expected a topology name (str) or None, got {self.topology!r}."
            )
        scale = self.time_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"Profile.time_scale: expected a number > 0, got {scale!r}.")
        object.__setattr__(self, "time_scale", float(scale))
        if not isinstance(self.host, str):
            raise TypeError(f"Profile.host: expected free text (str), got {self.host!r}.")
        if self.wp_spread is not None:
            spread = checked_spread(self.wp_spread, p, q, len(sizes))
            object.__setattr__(self, "wp_spread", spread)
        if self.decisions is not None:
            object.__setattr__(self, "decisions", checked_decisions(self.decisions, p, q))

    def decision(self, worker: int, kind: str) -> Decision | None:
        """The `Decision` of ``kind`` ("latency", "bandwidth", "threshold") for ``worker``.

        Returns:
          It, or None when the profile holds no decisions (``decisions=None``).

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> d = prof.decision(0, "bandwidth")
          >>> d.choice, d.basis
          (1, 'measured')
        """
        if self.decisions is None:
            return None
        return next(d for d in self.decisions if (d.worker, d.kind) == (worker, kind))

    # ---------------------------------------------------------------- equality

    def _scalars(self) -> tuple[Any, ...]:
        return (self.workers, self.proxies, self.sizes, self.topology, self.time_scale, self.host)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        if (self.wp_spread is None) != (other.wp_spread is None):
            return False
        if (
            self.wp_spread is not None
            and other.wp_spread is not None
            and not np.array_equal(self.wp_spread, other.wp_spread)
        ):
            return False
        return (
            self._scalars() == other._scalars()
            and self.decisions == other.decisions
            and all(np.array_equal(getattr(self, n), getattr(other, n)) for n, _ in TIME_FIELDS)
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays; see the class docstring

    def allclose(self, other: Profile, rtol: float = 1e-9, atol: float = 0.0) -> bool:
        """Whether ``other`` has the same mesh, sizes and labels, and times within tolerance.

        Args:
          other: the profile to compare with.
          rtol: relative tolerance, as in ``numpy.allclose``, for every time array.
          atol: absolute tolerance, as in ``numpy.allclose``.

        Returns:
          True when ``other`` is a `Profile` of the same mesh (workers and
          proxies), sizes, topology and host, and every time array is within
          the tolerance.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> prof.allclose(coarse.diagnostics.Profile.from_json_dict(prof.to_json_dict()))
          True
        """
        if not isinstance(other, Profile):
            raise TypeError(f"Profile.allclose: expected a Profile, got {type(other).__name__}.")
        if (self.workers, self.proxies, self.sizes) != (other.workers, other.proxies, other.sizes):
            return False
        if (self.topology, self.host) != (other.topology, other.host):
            return False
        if not math.isclose(self.time_scale, other.time_scale, rel_tol=rtol, abs_tol=atol):
            return False
        return all(
            np.allclose(getattr(self, n), getattr(other, n), rtol=rtol, atol=atol)
            for n, _ in TIME_FIELDS
        )

    # ---------------------------------------------------------------- derived

    def local_proxy(self, worker: int) -> int:
        """Worker ``worker``'s local proxy: ``worker // k``, k = workers / proxies.

        At COARSE 1:1 that is ``worker`` itself; `coarse.make_mesh` puts the
        local proxy under its workers, and routing prefers it on ties.

        Args:
          worker: the worker's index, ``0 .. workers - 1``.

        Returns:
          The proxy's index, ``0 .. proxies - 1``.

        Raises:
          ValueError: ``worker`` is not an index of the profile's workers.
          TypeError: ``worker`` is not an int.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("t4", 4, proxies=2, clock="virtual")
          >>> shared = coarse.make_mesh(workers=4, proxies=2)
          >>> prof = coarse.diagnostics.profile(shared, topology=topo, sizes=[1 << 10])
          >>> [prof.local_proxy(i) for i in range(4)]
          [0, 0, 1, 1]
        """
        if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)):
            raise TypeError(f"Profile.local_proxy: worker must be an int index, got {worker!r}.")
        if not 0 <= worker < self.workers:
            raise ValueError(
                f"Profile.local_proxy: worker must be in 0..{self.workers - 1}, got {worker}."
            )
        return local_proxy(int(worker), self.workers, self.proxies)

    def link(self, kind: str, what: str) -> np.ndarray:
        """One figure of every link of one kind, read from the measured times.

        Args:
          kind: ``"wp"``, worker -> proxy (``[p, q]``); ``"pp"``, the proxies'
            ring (``[q, 2]``: to the next, then to the previous neighbour); or
            ``"ww"``, the workers' ring (``[p, 2]``).
          what: ``"latency_us"``, the one-way time at the smallest size, in
            microseconds; ``"bandwidth_gbps"``, the one-way peak over sizes of
            size / time, GB/s; ``"bidir_bandwidth_gbps"``, the peak of 2 * size
            / time with both directions moving at once (push and pull; "wp" and
            "pp" only); ``"bandwidth_curve_gbps"``, size / time at every size
            (one more axis, following ``sizes``).

        Returns:
          The figure per link, a new array.

        Raises:
          ValueError: an unknown ``kind`` or ``what``, or "bidir_bandwidth_gbps"
            of the workers' ring (measured one way only).

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> lat = prof.link("wp", "latency_us")     # v100: local 3 us, remote 8 us (+ 1 KiB)
          >>> bool(lat[0, 0] < lat[0, 1]), prof.link("pp", "bandwidth_curve_gbps").shape
          (True, (4, 2, 2))
        """
        if kind not in LINK_KINDS or what not in FIGURES:
            raise ValueError(
                f"Profile.link: expected kind in {LINK_KINDS} and what in {FIGURES}, got "
                f"({kind!r}, {what!r})."
            )
        if kind == "ww" and what == "bidir_bandwidth_gbps":
            raise ValueError(
                "Profile.link: the workers' ring ('ww') is measured one way only; ask for "
                "'bandwidth_gbps', or for 'bidir_bandwidth_gbps' of 'wp' or 'pp'."
            )
        bidir = getattr(self, f"{kind}_bidir_s", None)
        return figure(getattr(self, f"{kind}_oneway_s"), bidir, self.sizes, what)

    # ---------------------------------------------------------------- JSON

    def to_json_dict(self) -> dict[str, Any]:
        """The profile as plain JSON values (arrays as nested lists), with its ``format`` tag.

        Returns:
          A dict that ``json.dumps`` accepts; `from_json_dict` reads it back.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> d = prof.to_json_dict()
          >>> d["format"], d["workers"], d["proxies"], d["sizes"]
          ('coarse_jax.profile/1', 4, 4, [1024, 1048576])
        """
        return file_format.to_json(self)

    @staticmethod
    def from_json_dict(data: Any, source: str = "profile") -> Profile:
        """Inverse of `to_json_dict`.

        A dict without ``"proxies"`` (written before COARSE k:1) is a 1:1
        profile: one proxy per worker.

        Args:
          data: the decoded JSON object.
          source: names the origin (a path) in error messages.

        Returns:
          The `Profile`.

        Raises:
          ValueError: not a ``coarse_jax.profile/1`` object, a missing field, or
            values `Profile` rejects.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> coarse.diagnostics.Profile.from_json_dict(prof.to_json_dict()) == prof
          True
        """
        fields = file_format.from_json(data, source)
        try:
            return Profile(**fields)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON to ``path`` (see `load`).

        Args:
          path: the file to write.

        Raises:
          OSError: the file cannot be written.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> import os, tempfile
          >>> path = os.path.join(tempfile.mkdtemp(), "v100.json")
          >>> prof.save(path)
          >>> coarse.diagnostics.Profile.load(path).workers
          4
        """
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json_dict(), f, indent=1)
            f.write("\n")

    @staticmethod
    def load(path: str | os.PathLike[str]) -> Profile:
        """Read a profile written by `save`.

        Args:
          path: the JSON file.

        Returns:
          The `Profile`.

        Raises:
          ValueError: the file is not JSON, or not a valid ``coarse_jax.profile/1`` profile.
          OSError: the file cannot be read.

        Example:
          >>> import os, tempfile
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> path = os.path.join(tempfile.mkdtemp(), "v100.json")
          >>> prof.save(path)
          >>> coarse.diagnostics.Profile.load(path).sizes
          (1024, 1048576)
        """
        with open(path, encoding="utf-8") as f:
            text = f.read()
        where = f"Profile.load({os.fspath(path)!r})"
        return Profile.from_json_dict(file_format.parse(text, where), source=where)

    # ---------------------------------------------------------------- reports

    def table(self) -> str:
        """A readable text summary: latency (us) / peak bandwidth (GB/s) of every link.

        One row per worker with its link to each of the q proxies (``*``
        marks the local proxy; LatProxy/BwProxy as the planner picks them),
        then each proxy's and each worker's ring neighbours
        (`coarse_jax.profiling.report.table`).

        Returns:
          The table as a string.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> print(prof.table())  # doctest: +ELLIPSIS
          Profile v100: 4 workers on cpu, 8 devices; sizes 1KiB..1MiB (2 sizes)
          ...
        """
        return report.table(self)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Write a PNG of bandwidth (GB/s) against transfer size (log x) to ``path``.

        See `coarse_jax.profiling.report.plot`.

        Args:
          path: the PNG file to write.

        Raises:
          ImportError: matplotlib is not installed.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
          >>> import os, tempfile
          >>> path = os.path.join(tempfile.mkdtemp(), "v100.png")
          >>> prof.plot(path)
          >>> os.path.getsize(path) > 0
          True
        """
        report.plot(self, path)
