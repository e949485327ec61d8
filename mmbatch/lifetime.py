"""Helper processes end with the job that started them, however it ends.

A job's helper processes (its engine replicas, with the processes vLLM starts under each,
and its decode workers) hold memory, and an engine holds a GPU: one that outlives a killed
job holds them for nobody, and the resumed job then finds the GPU full. Each helper is
given, as it is spawned, the read end of the job's *lifeline* (``lifeline``): a pipe whose
write end only the job holds, which the kernel closes however the job ends, ``kill -9``
included. ``end_with_parent`` starts a thread that waits for that and then ends the helper
at once (a replica: its whole process group, with vLLM's engine core and workers;
``end_own_group``).

Not ``prctl(PR_SET_PDEATHSIG)``: it fires when the *thread* that started the child ends,
and a job restarts a dead replica from its pipeline's driver thread, which ends with its
pipeline. Not the message pipe of a replica either: the job closes that one to stop it
cleanly while it lives on. Not ``multiprocessing``'s own pipe to each process it spawns
(``parent_process().sentinel``): a process the job forks holds a copy of the job's end of
it, out of reach (multiprocessing closes it only in the process that spawned), and a
helper would live as long as that copy, ``Dataset.map(num_proc=...)``'s workers outliving
a killed job. A forked child closes its copy of the lifeline's ends instead, at once, and
has a lifeline of its own for the helpers it spawns.

A process this one forks (``Dataset.map(num_proc=...)``'s workers) starts as a copy of it,
with the engines, pipelines and pools it keeps for later jobs, but not their threads: what
belongs to the parent's engines is the parent's, and each module that keeps such a thing
has the child forget it (``forgotten_in_forked_children``, ``KeptPerProcess``), so that the
child builds its own, as a process started afresh does.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from typing import Any, Generic, Protocol, TypeVar

ORPHANED_EXIT = 70
"""The exit code of a helper that ended because its job was gone (``os.EX_SOFTWARE``)."""


@contextmanager
def ctrl_c_left_to_the_job() -> Iterator[None]:
    """Processes started inside the ``with`` start with SIGINT blocked, and keep it so; and
    a Ctrl-C (or SIGTERM) for the job is taken once their start is over, not inside it.

    Ctrl-C in a terminal reaches the job's whole process group: a helper the job stops on
    its own would die of it where it stands (a decode worker still importing, or waiting
    for work) and print its traceback on the job's terminal. A blocked signal stays blocked
    across the helper's start (fork, then exec: ``spawn``) and is never delivered there.
    Only this thread's mask changes meanwhile: a Ctrl-C for the job is caught by another of
    its threads, and Python then raises it in the main thread. On the main thread, then,
    the signal's handler waits for the ``with`` to end (``_handled_after``): raised inside
    a start, between the helper's exec and the job writing it what to run, it left the
    helper reading an empty pipe, and its traceback on the terminal. multiprocessing's
    resource tracker is started first, as a spawn would start it: its start unblocks
    SIGINT in this thread."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _handled_after((signal.SIGINT, signal.SIGTERM)):
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def _handled_after(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """On the main thread, ``signals`` that come while the block runs are handled as it
    ends, by the handlers they had (the first that came; a second is the same request to
    stop). Elsewhere nothing changes: Python runs signal handlers on the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[tuple[int, Any]] = []
    # A handler set outside Python (None) is left alone: it could not be put back.
    held = [sig for sig in signals if signal.getsignal(sig) is not None]
    previous = {
        sig: signal.signal(sig, lambda signum, frame: came.append((signum, frame))) for sig in held
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if came:
            signum, frame = came[0]
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def take_ctrl_c_again() -> None:
    """In a helper started with Ctrl-C left to its job (``ctrl_c_left_to_the_job``), once a
    terminal's Ctrl-C can no longer reach it (it leads a process group of its own): SIGINT
    unblocked, here and in what it starts (vLLM's engine core stops on it), and one that
    came while it was blocked dropped (ignored while pending, a signal is discarded)."""
    if threading.current_thread() is not threading.main_thread():
        return  # only a process's main thread sets its handlers: not a helper's start
    kept = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, kept)


def _new_lifeline() -> list[Connection]:
    return list(multiprocessing.Pipe(duplex=False))  # [read end, write end]


_LIFELINE = _new_lifeline()
"""This process's lifeline: its ends, the write end never given to anyone."""


def _lifeline_of_its_own() -> None:
    """In a forked child: its copies of the parent's ends closed (the parent's helpers then
    see the parent's end as soon as it ends, whatever the child does), a new pipe made."""
    for end in _LIFELINE:
        end.close()
    _LIFELINE[:] = _new_lifeline()


os.register_at_fork(after_in_child=_lifeline_of_its_own)


def lifeline() -> Connection:
    """The read end of this process's lifeline, to give a helper as it is spawned (among its
    arguments: the spawn passes the helper a copy), which watches it (``end_with_parent``).
    Nothing is ever written on it: only its write end's closing, as this process ends, is
    news; no other process holds that end."""
    return _LIFELINE[0]


def end_with_parent(end: Callable[[], object], parents_lifeline: Connection) -> None:
    """Call ``end`` (on a thread of its own) as soon as the process that spawned this one,
    and gave it ``parents_lifeline`` (its ``lifeline``), is gone."""
    watch = threading.Thread(
        target=_wait_for_end_of,
        args=(parents_lifeline, end),
        name="mmbatch-end-with-parent",
        daemon=True,
    )
    watch.start()


def _wait_for_end_of(parents_lifeline: Connection, end: Callable[[], object]) -> None:
    """Block until the parent's end of its lifeline is closed (a read returns nothing),
    then ``end``. The read sleeps in the kernel, without the GIL: it costs nothing
    meanwhile."""
    with suppress(OSError):
        while os.read(parents_lifeline.fileno(), 4096):
            continue  # nothing is written on it; only its end matters
    end()


_PARENTS: list[object] = []
"""What forked children forgot (``forgotten_in_forked_children``), still referenced but
never used: freed in the child, the parent's objects would run their finalizers there,
which end or delete what is the parent's (vLLM's engine client ends its engine core)."""


def forgotten_in_forked_children(forget: Callable[[], object]) -> None:
    """Have each child this process forks call ``forget`` first of all: it drops state of
    its module's that belongs to this process's engines (used in the child, an engine's
    pipes would take the parent's answers, its pipeline would wait for a driver thread that
    the child has not), and returns what it dropped, which the child keeps and never uses
    (``_PARENTS``). Called once per module, as it is imported."""
    os.register_at_fork(after_in_child=lambda: _PARENTS.append(forget()))


class _Container(Protocol):
    def clear(self) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...


Kept = TypeVar("Kept", bound=_Container)


def emptied_in_forked_children(kept: _Container) -> None:
    """Have each child this process forks find ``kept`` (a module's engines, pipelines or
    pools) empty, emptied in place (a reference taken before the fork sees it empty too),
    what it held kept and never used (``forgotten_in_forked_children``)."""
    forgotten_in_forked_children(lambda: _emptied(kept))


def _emptied(kept: _Container) -> object:
    """A strong copy of what ``kept`` held (a weak set's engines too), ``kept`` cleared."""
    parents = dict(kept) if isinstance(kept, Mapping) else list(kept)
    kept.clear()
    return parents


class KeptPerProcess(Generic[Kept]):
    """What a module keeps for this process's later jobs (its engines, pipelines or pools: a
    container), with the lock that guards it, each used only inside ``locked``.

    A child this process forks (``forgotten_in_forked_children``) starts with both afresh:
    the container emptied, what it held kept and never used (the parent's engine or pool,
    copied without its threads, is not the child's to use or to end), and a new lock, as the
    parent's may have been held by one of its threads at the fork, which the child has not
    and which would never release it (the forking thread, if it was inside ``locked``,
    releases the one it took)."""

    def __init__(self, kept: Kept) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        emptied_in_forked_children(kept)
        forgotten_in_forked_children(self._renew_lock)

    @contextmanager
    def locked(self) -> Iterator[Kept]:
        """The container, this process's only, held by the caller for the ``with``."""
        with self._lock:
            yield self._kept

    def _renew_lock(self) -> None:
        """In a forked child: a new lock (its container is emptied beside it)."""
        self._lock = threading.Lock()


def live_processes(group: int | None = None, session: int | None = None) -> list[int]:
    """The live processes of process group ``group`` or of session ``session`` (zombies,
    which hold nothing and may wait long for a reaper in a container, do not count), read
    from ``/proc``; none where there is no ``/proc`` (not Linux)."""
    if not os.path.isdir("/proc"):
        return []
    with os.scandir("/proc") as entries:
        pids = [int(entry.name) for entry in entries if entry.name.isdigit()]
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state, _, pgrp, sid = stat.read().rsplit(b")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if state != b"Z" and (int(pgrp) == group or int(sid) == session):
            found.append(pid)
    return found


def end_own_group() -> None:
    """SIGKILL this process's group (this process and what it started: vLLM's engine core
    and workers), where this process leads one (``os.setpgid(0, 0)``); else this process
    alone. Nothing is left to save: the rows are the job's, and the job is gone."""
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(ORPHANED_EXIT)


_QUIET_TRACKER = [False]


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker for this process and all it spawns, with
    its stderr on /dev/null; nothing where it already runs. A command's own process calls
    this first (``mmbatch`` on the command line), never a library caller's: their tracker,
    and what it says, are theirs.

    The tracker is the cleanup of record for shared memory and semaphores: once every
    process holding it has ended (however: SIGKILL too), it unlinks what they registered
    and did not unlink, and warns of each. Ending engine processes at once at the job's
    exit (``engines_may_end_at_once``) leaves vLLM's shared memory to it by design, seconds
    sooner than vLLM's own teardown (on a CPU, 10 s waiting for its workers' Python to
    exit): the warnings would name that cleanup, not a leak."""
    from multiprocessing import resource_tracker

    if getattr(resource_tracker._resource_tracker, "_fd", None) is not None:
        return  # already running, and printing where it prints
    devnull = os.open(os.devnull, os.O_WRONLY)
    stderr = os.dup(2)
    os.dup2(devnull, 2)  # the tracker inherits fd 2 as it is now
    try:
        resource_tracker.ensure_running()
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(devnull)
    _QUIET_TRACKER[0] = True


def orphan_resource_tracker() -> None:
    """Start multiprocessing's resource tracker for this process and all it spawns as an
    orphan in a session of its own, with its stderr on /dev/null; nothing where one already
    runs. For a process whose direct children are killed as it ends:

    a Ray worker (an ``EngineReplica`` actor) kills its direct children as it exits, and the
    tracker, started by default as one, would be among them: vLLM's engine core, another,
    dies without unlinking the shared memory it made (160 MB on a CPU), and nothing is left
    to unlink it. Started here, through a shell that exits at once, the tracker outlives the
    worker: the engine core (killed) and its workers (which end when it does) close their
    ends of its pipe, and it unlinks what they left, as it does for a command's engines
    (``quiet_resource_tracker``), quietly: its warnings would name that cleanup, not a leak."""
    import subprocess
    from multiprocessing import resource_tracker, spawn

    tracker: Any = resource_tracker._resource_tracker  # its pipe's end and pid: private
    if tracker._fd is not None:
        return  # already running (this process's own, or inherited from its parent)
    read, write = os.pipe()
    command = f"from multiprocessing.resource_tracker import main;main({read})"
    argv = [spawn.get_executable(), "-B", "-c", command]
    try:
        subprocess.run(
            ["/bin/sh", "-c", '"$@" &', "sh", *argv],
            pass_fds=(read,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outside the worker's process group too
            check=True,
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    # As in a process spawned by one that runs the tracker: the write end, and no pid to
    # wait for (it is not this process's child).
    tracker._fd, tracker._pid = write, None


def engines_may_end_at_once() -> bool:
    """Whether this process's resource tracker is the quiet one (``quiet_resource_tracker``):
    engine processes holding shared memory may then be ended at the job's exit without
    waiting for vLLM's teardown."""
    return _QUIET_TRACKER[0]


def exit_now() -> None:
    """End this process at once (a decode worker: nothing of its own to clean up)."""
    os._exit(ORPHANED_EXIT)
