"""Several engines as one: a replica per GPU (or per tensor-parallel group of GPUs), each in
a process of its own, behind the one ``Engine`` protocol, so that the pipeline above is the
same for one GPU or eight.

Each request goes to one replica:

* **affinity**: a request on media a replica has just seen goes to that replica (the
  pipeline adds an image's or a video stretch's requests together), so its encoder cache
  and prefix cache hit;
* **balance**: any other request goes to the replica with the least work left (requests in
  flight, against its capacity), so a slower replica or longer requests do not hold the job
  back, as a fixed split would.

A replica that dies (a crash, an out-of-memory kill, a fatal engine error) fails nothing at
once: a fresh replica starts in its place, and the requests it held become *suspects*, tried
again as a group on a replica that holds no other suspects (beside its ordinary work). A
group that kills its replica again is split in two and each half tried in turn; a single
request that does is the poison, and becomes the one error row, however many requests were
in flight with it. Only when replicas keep dying without finishing anything does the job
stop (``FatalEngineError``). A restart's start-up (the model loaded again: minutes on a GPU)
is not the job's work: the engine counts its restarts and their seconds (``restarts``), which
the job's summary sets apart from its work's time and speed.

A replica is a spawned process running ``serve``: a thread receives the parent's messages
(so that sending a picture never waits for an engine step), the main loop adds them to its
engine and steps it, and results go back with the replica's capacity, cache counters and
queue depths. Pictures travel pickled: about a millisecond for a 448x448 image.

Each replica leads a process group of its own, which vLLM's engine core and workers join; no
engine outlives its job: a replica whose job is gone ends its group at once, however the job
ended (``mmbatch.lifetime``), and the group of a replica that dies alone is ended by the job
as it starts another.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from mmbatch.clock import milestone, milestones_wall, note_from
from mmbatch.engine.base import Engine
from mmbatch.engine.logs import printed_to
from mmbatch.errors import FatalEngineError, RequestRejected
from mmbatch.lifetime import (
    ctrl_c_left_to_the_job,
    end_own_group,
    end_with_parent,
    forgotten_in_forked_children,
    lifeline,
    live_processes,
    take_ctrl_c_again,
)
from mmbatch.media.limits import PromptLimits
from mmbatch.types import CacheStats, LoadedRequest, MediaItem, Restarts, Result, Sampling

EngineFactory = Callable[[], Engine]
"""Builds a replica's engine inside its process (picklable: a class or a ``partial``)."""

MAX_RESTARTS = 3
"""Deaths in a row per replica, without a result between them, after which the job stops
(the deaths that halve a group of suspects do not count: they narrow down a killer)."""
STEP_WAIT = 0.05
"""Seconds ``step`` waits for some replica's results before it returns empty-handed."""
AFFINITY_KEYS = 4096
"""Media keys remembered with the replica that last took them."""
STOP_WAIT = 30.0
"""Seconds a replica has to close its engine and exit, before it is ended by signal: more
than vLLM's engine core is given to stop (``mmbatch.engine.vllm.ENGINE_STOP_SECONDS``)."""
STATS_SECONDS = 0.5
"""How often a replica reads its engine's counters (cache hits, queue depths) for the
results it sends, and whenever it runs out of work, so that a job's final counts are
exact. Each read walks vLLM's metrics: 3.9 ms of Python (a 2-core CPU, vLLM 0.32's CPU
build, 2026-12-01), taken from the render thread on every engine step that finished a
request."""


@dataclass
class _InFlight:
    request: LoadedRequest
    media: Sequence[MediaItem]
    sampling: Sampling


@dataclass
class _Replica:
    index: int
    devices: str | None
    process: Any = None
    conn: Connection | None = None
    ready: bool = False
    capacity: int = 0
    cache: CacheStats = field(default_factory=CacheStats)
    depths: tuple[int, int] = (0, 0)
    held: set[str] = field(default_factory=set)
    trial: set[str] = field(default_factory=set)
    """The suspects this replica is trying (a subset of ``held``)."""
    backlog: list[tuple[Any, ...]] = field(default_factory=list)
    """Messages for a replica still starting, sent once it is ready."""
    restarted: float | None = None
    """When its process was started again after one died (``time.monotonic``), until its
    engine is ready; None: not restarting."""


class ReplicaEngine:
    """``Engine`` over one engine process per device group; see the module docstring."""

    def __init__(
        self,
        make_engine: EngineFactory,
        devices: Sequence[str | None],
        limits: Callable[[int, int | None], PromptLimits | None] | None = None,
        while_starting: Callable[[], None] | None = None,
        end_at_exit: bool = False,
        log: str | None = None,
    ) -> None:
        """Start one replica per entry of ``devices`` (each a ``CUDA_VISIBLE_DEVICES``
        value, or None to leave it alone) and wait until all are up. ``limits`` makes the
        pre-flight budget from a replica's ``(max_model_len, encoder cache tokens)``.
        ``while_starting`` runs here meanwhile (the check of the settings, which imports
        vLLM as each replica does: 15 s on a GPU host, no longer one after the other); if
        it raises, the replicas are ended at once, having nothing to keep, and the error
        goes on. ``end_at_exit``: at the interpreter's exit (every row safe by then), end
        the replicas at once instead of waiting for vLLM's teardown (seconds): only where
        that leaves nothing behind, an engine of one GPU, which shares no memory with
        workers of its own. ``log``: the file where each replica process prints (vLLM's
        log, what transformers and torch say), for its whole life; None: the terminal."""
        self._make_engine = make_engine
        self._log = log
        self._make_limits = limits
        self._context = multiprocessing.get_context("spawn")
        self._replicas = [_Replica(i, d) for i, d in enumerate(devices)]
        self._in_flight: dict[str, _InFlight] = {}
        self._where: dict[str, int] = {}  # request id -> replica
        self._affinity: dict[str, int] = {}  # media key -> replica that last took it
        self._failed: list[Result] = []
        self._suspects: deque[list[str]] = deque()  # groups to try, one per replica at a time
        self._deaths_in_a_row = 0
        self._restarts = Restarts(engines=len(self._replicas))
        """The restarts whose start-up is over (ready, or died again while starting)."""
        self._context_limits: tuple[int, int | None] | None = None
        self._close_hooks: list[Callable[[], object]] = []
        # Replicas are not daemonic; at exit the interpreter waits for them, so they are
        # stopped first (atexit runs this before multiprocessing's own join).
        self._at_exit = self._abandon if end_at_exit else self.close
        atexit.register(self._at_exit)
        _STARTED.add(self)
        try:
            for replica in self._replicas:
                self._start(replica)
        except BaseException:  # Ctrl-C as they start: the ones started end with the job
            self._abandon()
            raise
        milestone("engine_processes_spawned")
        if while_starting is not None:
            try:
                while_starting()
            except BaseException:
                self._abandon()
                raise
            milestone("settings_checked")
        for replica in self._replicas:
            self._await_ready(replica)
            milestone(f"engine_{replica.index}_ready")

    # -- Engine --------------------------------------------------------------------------

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        flight = _InFlight(portable(request), media, sampling)
        self._in_flight[request.id] = flight
        self._send_to(self._choose(request), flight)

    def step(self) -> list[Result]:
        self._try_suspects()
        results, self._failed = self._failed, []
        live = [r for r in self._replicas if r.conn is not None]
        readable = wait([r.conn for r in live if r.conn], timeout=0 if results else STEP_WAIT)
        for replica in live:
            conn = replica.conn
            if conn is None or conn not in readable:
                continue
            try:
                # A "fatal" message restarts the replica: its old pipe is closed then.
                while replica.conn is conn and conn.poll():
                    results += self._receive(replica, conn.recv())
            except (EOFError, OSError):
                if replica.conn is conn:
                    results += self._died(replica, "its process ended")
        for replica in self._replicas:
            if replica.process is not None and not replica.process.is_alive() and replica.conn:
                results += self._died(replica, f"its process exited ({replica.process.exitcode})")
        return results

    def num_unfinished(self) -> int:
        return len(self._in_flight) + len(self._failed)

    def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._in_flight.pop(request_id, None)
            index = self._where.pop(request_id, None)
            if index is not None:
                replica = self._replicas[index]
                replica.held.discard(request_id)
                self._send(replica, ("abort", [request_id]))

    def capacity(self) -> int:
        return sum(r.capacity for r in self._replicas if r.ready) or 1

    def queue_depths(self) -> tuple[int, int] | None:
        running = sum(r.depths[0] for r in self._replicas)
        waiting = sum(r.depths[1] for r in self._replicas)
        return running, waiting

    def cache_stats(self) -> CacheStats:
        total = CacheStats()
        for r in self._replicas:
            total = CacheStats(
                total.prefix_queries + r.cache.prefix_queries,
                total.prefix_hits + r.cache.prefix_hits,
                total.mm_queries + r.cache.mm_queries,
                total.mm_hits + r.cache.mm_hits,
            )
        return total

    def restarts(self) -> Restarts:
        """Replicas started again after their process died, and their start-up's seconds:
        each from its new process's start to its engine ready (or to its next start, where
        it died again first; up to now, while it still starts)."""
        now = time.monotonic()
        starting = [now - r.restarted for r in self._replicas if r.restarted is not None]
        done = self._restarts
        return replace(done, seconds=done.seconds + sum(starting))

    def prompt_limits(self) -> PromptLimits | None:
        if self._make_limits is None or self._context_limits is None:
            return None
        return self._make_limits(*self._context_limits)

    def close(self) -> None:
        """Stop every replica, all at once, and return when none of their processes is left
        (so the GPU's memory is free). A ready replica closes its engine, so that vLLM
        releases the shared memory its engine core and workers hold (killed, they leave it to
        Python's resource tracker, which warns of it as the job exits); one still starting
        has nothing to save and is ended at once. The close hooks (``on_close``) run first,
        once; one that fails still leaves no replica behind."""
        hooks, self._close_hooks = self._close_hooks, []
        try:
            for hook in hooks:
                hook()
        finally:
            self._stop_replicas()

    def _stop_replicas(self) -> None:
        told = []
        for replica in self._replicas:
            ready, process = replica.ready, self._tell_to_stop(replica)
            if ready:
                told.append(process)
            else:
                _end_all([process], wait=0.0)
        _end_all(told, wait=STOP_WAIT)

    def on_close(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` when the engine closes (what was kept for it goes too: its
        pipeline's decoding workers, its place in ``mmbatch.engine.registry``)."""
        if hook not in self._close_hooks:
            self._close_hooks.append(hook)

    @property
    def replicas(self) -> int:
        return len(self._replicas)

    # -- routing ---------------------------------------------------------------------------

    def _choose(self, request: LoadedRequest) -> _Replica:
        """The replica that last took this request's media, unless it is gone or much
        busier than the others; else the one with the least work left for its size."""
        ready = [r for r in self._replicas if r.ready]
        least = min(ready or [r for r in self._replicas if r.conn is not None], key=_load)
        key = request.media_keys[0] if request.media_keys else None
        if key is not None:
            index = self._affinity.get(key)
            if index is not None:
                kept = self._replicas[index]
                if kept.ready and _load(kept) <= _load(least) + 1.0:
                    least = kept
            if len(self._affinity) >= AFFINITY_KEYS:
                self._affinity.pop(next(iter(self._affinity)))
            self._affinity[key] = least.index
        return least

    def _send_to(self, replica: _Replica, flight: _InFlight) -> None:
        request_id = flight.request.id
        self._where[request_id] = replica.index
        replica.held.add(request_id)
        self._send(replica, ("add", flight.request, list(flight.media), flight.sampling))

    def _send(self, replica: _Replica, message: tuple[Any, ...]) -> None:
        if not replica.ready:
            replica.backlog.append(message)
            return
        assert replica.conn is not None
        # A replica that died cannot take it: step() sees the death, re-adds what it held.
        with contextlib.suppress(OSError):
            replica.conn.send(message)

    # -- replies, deaths, restarts ---------------------------------------------------------

    def _receive(self, replica: _Replica, message: tuple[Any, ...]) -> list[Result]:
        kind = message[0]
        if kind == "results":
            _, results, capacity, cache, depths = message
            replica.capacity, replica.cache, replica.depths = capacity, cache, depths
            done = []
            for result in results:
                if self._in_flight.pop(result.request_id, None) is None:
                    continue  # aborted, or re-added elsewhere after a death: not ours now
                replica.held.discard(result.request_id)
                replica.trial.discard(result.request_id)
                self._where.pop(result.request_id, None)
                done.append(result)
            if done:
                self._deaths_in_a_row = 0
            return done
        if kind == "ready":
            _, capacity, context_limits, moments = message
            replica.ready, replica.capacity = True, capacity
            self._restart_over(replica)
            note_from(f"engine_{replica.index}", moments)
            self._context_limits = self._context_limits or context_limits
            backlog, replica.backlog = replica.backlog, []
            for queued in backlog:
                self._send(replica, queued)
            return []
        if kind == "fatal":
            return self._died(replica, message[1])
        if kind == "lost":
            self._forget(replica, message[1])
            return []
        raise RuntimeError(f"bug: a replica sent {kind!r}")

    def _forget(self, replica: _Replica, request_ids: Sequence[str]) -> None:
        """Requests the replica's engine lost (it holds none, yet returned none of these): no
        longer held here either, so that the pipeline sees them lost and says so."""
        for request_id in request_ids:
            if self._in_flight.pop(request_id, None) is not None:
                replica.held.discard(request_id)
                replica.trial.discard(request_id)
                self._where.pop(request_id, None)

    def _died(self, replica: _Replica, why: str) -> list[Result]:
        """Restart ``replica``; its requests become suspects, and a suspect that kills a
        replica alone is failed (see the module docstring)."""
        held, replica.held = replica.held, set()
        trial, replica.trial = replica.trial, set()
        replica.backlog = []  # what it was still to be sent is in ``held``: tried again
        self._stop(replica)
        live = {r for r in held | trial if r in self._in_flight}
        suspects = sorted(live & trial) if trial else sorted(live)
        bystanders = sorted(live - set(suspects))
        # Halving a group known to hold a killer is progress, not a sign of a broken engine:
        # only the other deaths count against the job.
        if not (trial and len(suspects) > 1):
            self._deaths_in_a_row += 1
        if self._deaths_in_a_row > MAX_RESTARTS * len(self._replicas):
            raise FatalEngineError(
                f"engine replicas died {self._deaths_in_a_row} times without finishing a "
                f"request; the last: replica {replica.index} ({why})"
            )
        self._restart_over(replica)  # it died while it was starting again
        replica.restarted = time.monotonic()
        self._restarts = replace(self._restarts, count=self._restarts.count + 1)
        self._start(replica)
        failed = []
        if trial and len(suspects) == 1:
            (poison,) = suspects
            del self._in_flight[poison]
            self._where.pop(poison, None)
            message = (
                f"the engine died each time this request was in it (last: {why}); it is "
                "left out so that the rest of the job goes on"
            )
            failed.append(Result.failure(poison, "engine", message, "engine"))
        elif trial:
            # The group being tried killed it again: the poison is in one of its halves.
            half = len(suspects) // 2
            self._suspects.extendleft([suspects[half:], suspects[:half]])
        elif suspects:
            self._suspects.append(suspects)
        if trial and bystanders:
            self._suspects.append(bystanders)  # most likely innocent: tried after the halves
        return failed

    def _restart_over(self, replica: _Replica) -> None:
        """``replica``'s restart, if it was restarting, is over: its seconds are counted."""
        if replica.restarted is not None:
            seconds = self._restarts.seconds + time.monotonic() - replica.restarted
            self._restarts = replace(self._restarts, seconds=seconds)
            replica.restarted = None

    def _try_suspects(self) -> None:
        """Give each ready replica without a trial the next group of suspects."""
        for replica in self._replicas:
            if not self._suspects:
                return
            if replica.ready and not replica.trial:
                group = [r for r in self._suspects.popleft() if r in self._in_flight]
                replica.trial = set(group)
                for request_id in group:
                    self._send_to(replica, self._in_flight[request_id])

    def _start(self, replica: _Replica) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=serve,
            args=(self._make_engine, replica.devices, child, lifeline(), self._log),
            name=f"mmbatch-replica-{replica.index}",
            # Not daemonic: vLLM starts processes of its own (its engine core, tensor-parallel
            # workers), which a daemonic process may not. A replica whose job is gone ends
            # its group by itself (``serve``).
        )
        # Known before it starts: however its start ends (a Ctrl-C held back meanwhile is
        # taken as the ``with`` ends), the replica is ended with the others, never left
        # running for the interpreter's exit to wait on.
        replica.process, replica.conn, replica.ready = process, parent, False
        try:
            with ctrl_c_left_to_the_job():  # until it leads a group of its own (``serve``)
                process.start()
        finally:
            child.close()

    def _await_ready(self, replica: _Replica) -> None:
        assert replica.conn is not None
        while not replica.ready:
            try:
                message = replica.conn.recv()
            except (EOFError, OSError):
                where = f"in {self._log}" if self._log is not None else "above"
                raise FatalEngineError(
                    f"engine replica {replica.index} ended while starting "
                    f"(exit code {replica.process.exitcode}); its log is {where}"
                ) from None
            if message[0] == "fatal":
                raise FatalEngineError(f"engine replica {replica.index}: {message[1]}")
            self._receive(replica, message)

    def _stop(self, replica: _Replica) -> None:
        """End a replica that died or sent a fatal error: nothing in it is worth waiting for."""
        _end_all([self._tell_to_stop(replica)], wait=0.0)

    def _abandon(self) -> None:
        """End every replica now, with whatever it started: none holds anything worth
        waiting for (none is ready yet, or every row is safe)."""
        _end_all([self._tell_to_stop(replica) for replica in self._replicas], wait=0.0)

    def _let_go(self) -> None:
        """In a child forked from this engine's process, whose copy this is: leave the
        replicas to the parent, which uses and ends them. The child closes its copies of
        their pipes (nothing it does reaches them, and it reads none of their answers) and
        drops the exit handler that would end them."""
        atexit.unregister(self._at_exit)
        for replica in self._replicas:
            if replica.conn is not None:
                replica.conn.close()
            replica.conn, replica.process, replica.ready = None, None, False

    def _tell_to_stop(self, replica: _Replica) -> Any:
        """Ask the replica to stop (it closes its engine) and let go of it; its process."""
        if replica.conn is not None:
            with contextlib.suppress(OSError):
                replica.conn.send(("stop",))
            replica.conn.close()
        process = replica.process
        replica.conn, replica.process, replica.ready = None, None, False
        return process


_STARTED: weakref.WeakSet[ReplicaEngine] = weakref.WeakSet()
"""The engines of replicas this process started."""


def _let_go_in_child() -> object:
    """A forked child's copies of its parent's engines, each let go (``_let_go``)."""
    engines = list(_STARTED)
    _STARTED.clear()
    for engine in engines:
        engine._let_go()
    return engines


forgotten_in_forked_children(_let_go_in_child)


def _end_all(processes: Sequence[Any], wait: float) -> None:
    """Give the replicas told to stop ``wait`` seconds to exit, together; then end each one
    left, and what is left of every one's process group (the replica, vLLM's engine core and
    workers, which all joined it), by SIGKILL, and wait until none of them runs."""
    live = [process for process in processes if process is not None and process.pid is not None]
    deadline = time.monotonic() + wait
    for process in live:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in live:
        process.kill()  # if alive; itself first: it may not have made its group yet
        _end_group(process.pid)
        process.join()
    gone = time.monotonic() + STOP_WAIT
    while any(live_processes(group=p.pid) for p in live) and time.monotonic() < gone:
        time.sleep(0.02)


def _end_group(pgid: int) -> None:
    """SIGKILL a replica's process group: the replica and every vLLM process it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def portable(request: LoadedRequest) -> LoadedRequest:
    """``request`` without the source bytes its media references may hold (a view into a
    memory-mapped dataset cannot be pickled, and the replica needs only the decoded items)."""
    refs = request.request.media
    if all(ref.data is None and ref.image is None for ref in refs):
        return request
    bare = tuple(replace(ref, data=None, image=None) for ref in refs)
    return LoadedRequest(replace(request.request, media=bare), request.media_keys)


def _load(replica: _Replica) -> float:
    return len(replica.held) / max(1, replica.capacity)


def serve(
    make_engine: EngineFactory,
    devices: str | None,
    conn: Connection,
    parents_lifeline: Connection,
    log: str | None = None,
) -> None:
    """A replica process: build the engine on ``devices``, then add, step and report until
    told to stop (or until the parent is gone: ``parents_lifeline``), printing into ``log``
    (None: the terminal): everything it prints is the engine's or its libraries'; the job's
    own lines are the parent's."""
    with printed_to(log, every_thread=True):
        _serve(make_engine, devices, conn, parents_lifeline)


def _serve(
    make_engine: EngineFactory, devices: str | None, conn: Connection, parents_lifeline: Connection
) -> None:
    # A process group of its own (vLLM's engine-core and worker processes join it): Ctrl-C in
    # a terminal reaches the job's group only, so the parent alone decides when an engine
    # stops, and stops it cleanly, instead of every engine dying under it at once.
    os.setpgid(0, 0)
    take_ctrl_c_again()  # held back while it started, when the job's group was its own
    # The job gone (killed, even by SIGKILL, even while this engine still loads) ends this
    # group at once: an engine that outlives its job holds its GPU for nobody.
    end_with_parent(end_own_group, parents_lifeline)
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        engine = make_engine()
        limits = getattr(engine, "context_limits", lambda: (0, None))()
    except FatalEngineError as exc:  # says why already
        _reply(conn, ("fatal", str(exc)))
        return
    except Exception as exc:
        _reply(conn, ("fatal", f"the engine did not start: {type(exc).__name__}: {exc}"))
        return
    try:
        # Its start-up's moments (started, vLLM imported, engine built) go into the job's;
        # no reply: it was stopped while starting.
        if _reply(conn, ("ready", engine.capacity(), limits, milestones_wall())):
            _serve_engine(engine, conn)
    finally:
        # vLLM's own engine-core process is not ours to leave behind: closed here, whatever
        # ended the loop (a stop, the parent gone, the engine dead).
        getattr(engine, "close", lambda: None)()


def _serve_engine(engine: Engine, conn: Connection) -> None:
    inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    threading.Thread(target=_receive_into, args=(conn, inbox), daemon=True).start()
    rejected: list[Result] = []
    held: set[str] = set()  # added to the engine, no result yet
    last_report = stats_read = 0.0
    stats: tuple[int, CacheStats, tuple[int, int]] | None = None
    while True:
        idle = not engine.num_unfinished() and not rejected
        try:
            message = inbox.get(timeout=None if idle else 0)
        except queue.Empty:
            message = None
        while message is not None:
            if message[0] == "stop":
                return
            if message[0] == "add":
                _, request, media, sampling = message
                try:
                    engine.add(request, media, sampling)
                    held.add(request.id)
                except RequestRejected as exc:
                    rejected.append(Result.failure(request.id, exc.stage, str(exc), exc.kind))
            elif message[0] == "abort":
                engine.abort(message[1])
                held.difference_update(message[1])
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                message = None
        try:
            results = rejected + (engine.step() if engine.num_unfinished() else [])
        except FatalEngineError as exc:
            _reply(conn, ("fatal", str(exc)))
            return
        except Exception as exc:  # a bug in the engine, set off by some request in it
            _reply(conn, ("fatal", f"its step raised {type(exc).__name__}: {exc}"))
            return
        rejected = []
        held.difference_update(r.request_id for r in results)
        if held and not engine.num_unfinished():
            lost, held = sorted(held), set()
            if not _reply(conn, ("lost", lost)):
                return
        now = time.monotonic()
        if results or now - last_report > 1.0:
            last_report = now
            if stats is None or now - stats_read >= STATS_SECONDS or not engine.num_unfinished():
                stats_read = now
                stats = (engine.capacity(), engine.cache_stats(), engine.queue_depths() or (0, 0))
            if not _reply(conn, ("results", results, *stats)):
                return


def _reply(conn: Connection, message: tuple[Any, ...]) -> bool:
    """Send ``message`` to the parent; False when it is gone (it closed the pipe while
    stopping this replica, or ended): the replica then stops, quietly."""
    try:
        conn.send(message)
    except OSError:
        return False
    return True


def _receive_into(conn: Connection, inbox: queue.SimpleQueue[tuple[Any, ...]]) -> None:
    """Read the parent's messages as they come (a picture's send then never waits for an
    engine step); the parent gone is a stop."""
    while True:
        try:
            inbox.put(conn.recv())
        except (EOFError, OSError):
            inbox.put(("stop",))
            return
