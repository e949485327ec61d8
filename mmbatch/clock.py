"""The process's own clock: seconds since the command started, and the moments of its
start-up worth knowing (``OUT.summary.json``'s ``startup_phases``).

A user times the whole command; a job's own counters start with its engine. The moments in
between (inputs listed, engine processes spawned, settings checked, engines ready, first
row) are what a start-up that is slower than it should be is read from, on a host where no
profiler runs.

The command's start is the later of two: the process's (the kernel's record, ``/proc``) and
the interpreter's own. They differ when the command was started through ``exec`` (``bash -c
'setup && mmbatch ...'`` runs mmbatch in the shell's process): the process then started
with the shell, and its age counts the setup. Linux keeps no time of an ``exec``, so the
interpreter's start is estimated where mmbatch is first imported (``mmbatch/__init__``
imports this module first): that moment, less the CPU time the process had used by then.
Python's start-up before it is CPU work (reading and running its modules), and a shell that
only waited on its children used almost none.
"""

from __future__ import annotations

import os
import threading
import time

_IMPORTED = time.perf_counter()
_INTERPRETER_STARTED = _IMPORTED - time.process_time()
"""The interpreter's start, on ``perf_counter``'s clock (see the module's docstring)."""
_MILESTONES: dict[str, float] = {}
_LOCK = threading.Lock()


def process_seconds() -> float:
    """Seconds since the command started, interpreter start-up and imports included: what
    a user timing the command sees. The later of the process's start (from ``/proc``) and
    the interpreter's own (see the module's docstring), so that what ran in the process
    before it ``exec``'d Python is not counted."""
    interpreter = max(0.0, time.perf_counter() - _INTERPRETER_STARTED)
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19])  # clock ticks after boot
        with open("/proc/uptime", "rb") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return interpreter
    return min(interpreter, max(0.0, now - started / os.sysconf("SC_CLK_TCK")))


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
