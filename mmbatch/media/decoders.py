"""The decode pool: worker processes shared by every feeder of a process, and the one item
whose decoder kills its worker found and failed alone.

A worker that dies (a decoder crashing on hostile bytes, the kernel's OOM killer) breaks the
whole process pool, and every decode then in flight fails with it, the culprit's and its
innocent neighbours' alike. So a decode in flight at such a death is not failed: it is tried
again alone, one at a time in a pool of one worker, and only an item whose worker dies
there too (its second death, as a request in flight at two engine deaths) becomes an error
row. The others get their pictures, as they would have without the crash. Workers that die
whatever they are given (a pool that cannot start) are told apart by that: after
``UNUSABLE_AFTER`` deaths alone with no decode finished in between, the job stops loudly.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, ParamSpec, TypeVar

from mmbatch.errors import DecodersFailed
from mmbatch.lifetime import (
    KeptPerProcess,
    ctrl_c_left_to_the_job,
    end_with_parent,
    exit_now,
    lifeline,
)
from mmbatch.mainguard import check_main_guard
from mmbatch.media.decode import Decoded, DecodeJob, decode
from mmbatch.types import ItemError

_P = ParamSpec("_P")
_T = TypeVar("_T")

UNUSABLE_AFTER = 5
"""Deaths alone in a row, with no decode finished in between, that say the workers, not the
items, are what is wrong."""

Done = Callable[[DecodeJob, Decoded], None]
"""Told each job's outcome once: its items, or an ``ItemError`` per key."""

_POOLS = KeptPerProcess(dict[int, Executor]())
"""This process's decode pools by worker count. A forked child (a ``Dataset.map(num_proc=...)``
worker) starts its own: the parent's, copied without the threads that feed them, would take
jobs and never run them."""


class Decoders:
    """Decodes jobs on this process's shared pool of ``workers`` processes (0: one thread),
    and finds the item that kills a worker by trying the bystanders of a death alone."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = decode_pool(workers)
        self._lock = threading.Lock()
        self._suspects: deque[tuple[DecodeJob, Done]] = deque()
        self._alone: Executor | None = None
        self._alone_busy = False
        self._deaths_in_a_row = 0
        self.fatal: DecodersFailed | None = None
        """Set once the workers die whatever they decode: the job cannot go on."""

    def submit(self, job: DecodeJob, done: Done) -> None:
        """Decode ``job``; ``done`` is called once with its outcome, on a pool's thread."""
        self._run(job, done, alone=False)

    def close(self) -> None:
        with self._lock:
            alone, self._alone = self._alone, None
        if alone is not None:
            alone.shutdown(wait=False, cancel_futures=True)

    def _run(self, job: DecodeJob, done: Done, *, alone: bool) -> None:
        portable = job.portable() if self.workers else job
        pool = self._alone_pool() if alone else self._pool
        try:
            future = pool.submit(decode, portable)
        except BrokenProcessPool:  # broken since another job's death; its swap is under way
            pool = self._replace(pool)
            future = pool.submit(decode, portable)
        future.add_done_callback(partial(self._finished, job, done, pool, alone))

    def _finished(
        self, job: DecodeJob, done: Done, pool: Executor, alone: bool, future: Future[Decoded]
    ) -> None:
        try:
            made = future.result()
        except BrokenProcessPool:
            self._replace(pool)
            if not alone:
                with self._lock:
                    self._suspects.append((job, done))
                self._next_suspect(finished=False)
                return
            made = _failed(job, "the decoder process died on this item, tried alone")
            with self._lock:
                self._deaths_in_a_row += 1
                if self._deaths_in_a_row >= UNUSABLE_AFTER and self.fatal is None:
                    self.fatal = DecodersFailed(
                        f"the decode worker processes died {self._deaths_in_a_row} times in "
                        "a row, each on one item alone, with none decoded in between: they "
                        "cannot run here (see the errors above them)"
                    )
        except Exception as exc:
            made = _failed(job, f"the decoder process failed: {type(exc).__name__}: {exc}")
        else:
            with self._lock:
                self._deaths_in_a_row = 0
        if alone:
            self._next_suspect(finished=True)
        done(job, made)

    def _next_suspect(self, *, finished: bool) -> None:
        """Start the next suspect once none is running (``finished``: one just ended)."""
        with self._lock:
            if finished:
                self._alone_busy = False
            if self._alone_busy or not self._suspects:
                return
            self._alone_busy = True
            job, done = self._suspects.popleft()
        self._run(job, done, alone=True)

    def _alone_pool(self) -> Executor:
        with self._lock:
            if self._alone is None:
                self._alone = _new_pool(1)
            return self._alone

    def _replace(self, broken: Executor) -> Executor:
        """A pool in place of ``broken`` (replaced once, however many jobs saw it break)."""
        with self._lock:
            if broken is self._alone:
                self._alone = _new_pool(1)
                broken.shutdown(wait=False, cancel_futures=False)
                return self._alone
            if broken is self._pool:
                self._pool = decode_pool(self.workers, broken=broken)
            return self._pool


def _failed(job: DecodeJob, message: str) -> Decoded:
    return dict.fromkeys(job.keys, ItemError("decode", message, "corrupt"))


def decode_pool(workers: int, broken: Executor | None = None) -> Executor:
    """This process's decode pool of ``workers`` processes (0: one thread), started on first
    use and shared by every feeder: its workers' start (a second or two of imports each) is
    paid once per process, not per job. ``broken``: a pool whose worker died, replaced."""
    with _POOLS.locked() as pools:
        pool = pools.get(workers)
        if pool is None or pool is broken:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=False)
            pool = pools[workers] = _new_pool(workers)
        return pool


def start_decoders(workers: int) -> None:
    """Start the decode pool's workers now (they import in the background), so that they
    are ready when the engine is: call before building the engine."""
    pool = decode_pool(workers)
    if workers > 0:
        for _ in range(workers):
            pool.submit(_warm)


class _DecodeWorkers(ProcessPoolExecutor):
    """The pool of decode workers, spawned with Ctrl-C left to their job
    (``ctrl_c_left_to_the_job``), which stops them as it stops its pool, at its own pace.

    The pool starts a worker as it takes work, inside ``submit``, and counts it there; so a
    Ctrl-C that comes during a ``submit`` is taken once it is over. Taken between a
    worker's start and its counting, the pool later sent its end-of-work to one worker
    too few, and the job's exit waited for the last worker forever. Once every worker has
    started, a ``submit`` starts none (the pool never starts more than ``workers``), and
    takes work without holding signals: the job's every decode goes through it."""

    def __init__(self, workers: int, **kwargs: Any) -> None:
        super().__init__(workers, **kwargs)
        self._workers = workers

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        started = self._processes  # None once shut down: ``submit`` then refuses the work
        if started is not None and len(started) >= self._workers:
            return super().submit(fn, *args, **kwargs)
        with ctrl_c_left_to_the_job():
            return super().submit(fn, *args, **kwargs)


def _new_pool(workers: int) -> Executor:
    if workers <= 0:
        return ThreadPoolExecutor(1, thread_name_prefix="mmbatch-decode")
    # Spawned, not forked: the parent holds threads (and perhaps CUDA), which a fork
    # would copy in whatever state they are in. So a script must be guarded.
    check_main_guard()
    return _DecodeWorkers(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(lifeline(),),
    )


def _start_worker(parents_lifeline: Connection) -> None:
    """The pool's initializer: a worker ends as soon as its job is gone (killed, it leaves
    no one to shut the pool down), and imports its decoders (``_warm``)."""
    end_with_parent(exit_now, parents_lifeline)
    _warm()


def _warm() -> None:
    """Import the decoders once per worker, before its first job needs them, and decode on
    one FFmpeg thread (``set_decoder_threads``: the workers are the parallelism). Run as the
    pool starts a worker, where one that raises breaks the pool for every item, so a host
    without PyAV still decodes pictures (a video there fails as its own error row)."""
    import PIL.Image  # noqa: F401

    from mmbatch.media.container import set_decoder_threads

    set_decoder_threads(1)

    with contextlib.suppress(ImportError):
        import av  # noqa: F401
