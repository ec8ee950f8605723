"""The runtime's thread starts, parks and wake-ups (``ffi/runtime/wakeups.h``).

A sync's fixed cost on a host is mostly threads: the proxies' jobs start on
the runtime's service threads, and each wait that cannot go on parks its
thread on a condition variable until a peer's progress wakes it. These
counters break that cost down. They are process-wide and cumulative: take a
`WakeupStats` before and after some steps and subtract (`WakeupStats.__sub__`),
or `reset_wakeup_stats` first. Summed over the CPU and CUDA runtimes.
"""

from __future__ import annotations

import dataclasses

from coarse_jax._ffi.extension import _modules, cpu_module, summed_counters


@dataclasses.dataclass(frozen=True)
class WakeupStats:
    """Counts since the last reset (see the module docstring).

    Attributes:
      thread_starts: runtime threads created (the service pool, the streams
        backend's queues, the host optimizer's pool).
      parks: times a wait slept on a condition variable (one per sleep; a
        long wait sleeps in slices of 100 ms, for Ctrl-C).
      woke_with_work: parks that ended with the wait's condition met.
      spin_found: waits whose condition was met while they spun, before
        parking (no sleep, no wake-up needed).
      notify_sleeper: state changes that woke a parked waiter.
      notify_no_sleeper: state changes that found no waiter parked.
      jobs_started: proxies' jobs started on the service threads (q per sync).
      jobs_late: of those, jobs that started after a push of their sync had
        already arrived: not ready before the sync's first push.
      jobs_queued_at_push: jobs queued by a push, the first call of their
        sync on any worker: nothing could start them earlier. A
        `coarse.value_and_grad` or `coarse.value_and_update` queues them
        before its forward pass (``coarse_begin``), so only a lone
        `coarse.all_reduce`, with nothing before its push, counts here.
      parked_ns: nanoseconds the sessions' waits spent parked, summed over
        threads (a service thread's idle time between jobs is not counted).
      job_start_ns: nanoseconds from the first worker call queuing a proxy's
        job to the job starting, summed over jobs.
    """

    thread_starts: int = 0
    parks: int = 0
    woke_with_work: int = 0
    spin_found: int = 0
    notify_sleeper: int = 0
    notify_no_sleeper: int = 0
    jobs_started: int = 0
    jobs_late: int = 0
    jobs_queued_at_push: int = 0
    parked_ns: int = 0
    job_start_ns: int = 0

    def __sub__(self, other: WakeupStats) -> WakeupStats:
        return WakeupStats(
            **{
                f.name: getattr(self, f.name) - getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    def __add__(self, other: WakeupStats) -> WakeupStats:
        return WakeupStats(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    def per(self, n: int) -> dict[str, float]:
        """Each count divided by `n` (per sync, given the syncs they span)."""
        return {f.name: getattr(self, f.name) / n for f in dataclasses.fields(self)}


def wakeup_stats() -> WakeupStats:
    """The counters now, summed over the loaded runtimes."""
    return WakeupStats(**summed_counters("wakeup_stats"))


def reset_wakeup_stats() -> None:
    """Zeroes the counters of every loaded runtime."""
    cpu_module()
    for module in _modules():
        module.reset_wakeup_stats()


def set_service_idle_ms(ms: int) -> int:
    """Testing: how long a service thread beyond the pool's reservation waits idle
    before it exits (30000 by default); returns the previous value.

    The pool keeps the threads a session reserved (2 per proxy) for good, so a
    steady run starts none after its first step whatever this is.
    """
    return int(cpu_module().set_service_idle_ms(int(ms)))


def service_threads() -> int:
    """The threads the CPU runtime's service pool holds now."""
    return int(cpu_module().service_threads())


def set_wait_spin_ns(ns: int) -> int:
    """How long the runtime's waits spin before they park, in ns; returns the previous value.

    The default depends on the host's hardware threads: none up to 2 (a wait
    only yields once, so it never holds a core that a device thread needs),
    then 2 us per thread beyond 2, at most 50 us. A negative value restores it.
    """
    return int(cpu_module().set_wait_spin_ns(int(ns)))
