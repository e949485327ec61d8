"""The process's own clock: seconds since the command started, and the moments of its
start-up worth knowing (``OUT.summary.json``'s ``startup_phases``).

A user times the whole command; a job's own counters start with its engine. The moments in
between (inputs listed, engine processes spawned, settings checked, engines ready, first
row) are what a start-up that is slower than it should be is read from, on a host where no
profiler runs.
"""

from __future__ import annotations

import os
import threading
import time

_IMPORTED = time.perf_counter()
_MILESTONES: dict[str, float] = {}
_LOCK = threading.Lock()


def process_seconds() -> float:
    """Seconds since this process started, interpreter start-up and imports included (from
    ``/proc``): what a user timing the command sees. Where ``/proc`` is missing, since this
    module was imported."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19])  # clock ticks after boot
        with open("/proc/uptime", "rb") as uptime:
            now = float(uptime.read().split()[0])
        return max(0.0, now - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


def milestone(name: str) -> None:
    """Note that ``name`` happened now (the first time only: a process running job after
    job, a ``Dataset.map``, keeps its start-up's)."""
    with _LOCK:
        _MILESTONES.setdefault(name, round(process_seconds(), 3))


def milestones() -> dict[str, float]:
    """The moments noted so far, in seconds since the process started, in order."""
    with _LOCK:
        return dict(sorted(_MILESTONES.items(), key=lambda item: item[1]))


def milestones_wall() -> dict[str, float]:
    """``milestones`` as wall-clock times (``time.time()``), with this process's start as
    ``started``: what another process can place on its own clock (``note_from``)."""
    started = time.time() - process_seconds()
    return {"started": started} | {name: started + s for name, s in milestones().items()}


def note_from(prefix: str, moments: dict[str, float]) -> None:
    """Note another process's ``milestones_wall`` here, each as ``PREFIX_NAME``, in this
    process's seconds (a replica's start-up, inside the job's)."""
    started = time.time() - process_seconds()
    with _LOCK:
        for name, wall in moments.items():
            _MILESTONES.setdefault(f"{prefix}_{name}", round(wall - started, 3))
