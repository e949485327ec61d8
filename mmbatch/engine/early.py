"""The engine's start, begun as soon as its settings are known, while the face still reads
its inputs.

A job's engine needs seconds to tens of seconds to start (vLLM's import in each engine
process, the model's load, the memory profile); reading a job's inputs (a batch file's
lines parsed through vLLM's request models, a folder listed, a dataset's rows) needs seconds
too. Done one after the other, a user waits for both; begun together, for the longer.

``EngineStart.begin`` reads the host (a configuration mistake is said at once, before the
inputs are read) and starts the engine's processes in a thread of this process, laid out
for the job's size as the face counted it cheaply (lines of a batch file, rows of a dataset
from its metadata; None: not known, laid out as a job of unknown size). The runner then
takes the engine from it (``engine``) once the inputs are read, as it would start one: the
engine started early is used when it was sized for the media the job's requests carry,
else it is closed and the job's own started (as it is where the start begun for the
face's guess failed and the job carries other media: a model that takes no audio, say,
started for a folder's audio files that the job then leaves out).

``begun_while_reading`` is how a face uses it: the start begun before the face reads its
inputs, closed if reading them fails (a mistake in the inputs, Ctrl-C) or if the job ends
without taking its engine.

Where this process must hold its engine itself (``Host.in_process``, a daemonic
``Dataset.map`` worker), the start is left to ``engine``, in the caller's thread: an
in-process vLLM engine is not built from a second thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mmbatch.clock import milestone
from mmbatch.engine.base import Engine
from mmbatch.engine.builder import Host, read_host
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import Layout
from mmbatch.types import Modality


@dataclass
class EngineStart:
    """An engine's start for ``host``, begun (``begin``) before the job's inputs are read."""

    host: Host
    media: dict[Modality, int]
    """The media per prompt the engine is sized for (the face's cheap count)."""
    layout: Layout
    taken: bool = False
    """Whether the job took its engine from here (``engine``): its own to close."""
    _built: tuple[Engine, Layout] | None = None
    _error: BaseException | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    _own: bool = False
    """Whether the start built its engine (not one kept from an earlier job)."""
    _abandoned: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def begin(
        cls,
        config: EngineConfig,
        media: dict[Modality, int],
        requests: int | None,
    ) -> EngineStart:
        """The host read for ``config`` (``ConfigError`` now for a mistake it shows), and
        its engine's start begun in the background where this process may start engine
        processes, for a job of about ``requests`` (None: not known)."""
        host = read_host(config)
        start = cls(host, dict(media), host.layout(requests))
        if not host.in_process and host.may_start_processes:
            start._thread = threading.Thread(
                target=start._start, name="mmbatch-engine-start", daemon=True
            )
            milestone("engine_start_begun")
            start._thread.start()
        return start

    def _start(self) -> None:
        from mmbatch.engine.registry import kept_engine

        self._own = kept_engine(self.host.config, self.media) is None
        try:
            built = _shared(self.host, self.media, self.layout)
        except BaseException as exc:  # said in the caller's thread, by ``engine``
            self._error = exc
            return
        with self._lock:
            self._built = built
            abandoned = self._abandoned
        if abandoned:  # the job stopped while this started: nothing will use it
            self.close()

    def engine(self, media: dict[Modality, int]) -> tuple[Engine, Layout]:
        """The engine for requests carrying ``media`` per prompt, and its layout: the one
        begun, once started (its start's error raised here), where it was sized for at
        least as many of each; else the job's own."""
        self.taken = True
        if self._thread is None:  # started here, now
            self._thread = threading.current_thread()
            self._start()
        else:
            self._thread.join()
        covers = all(self.media.get(m, 0) >= n for m, n in media.items())
        if self._error is None and covers:
            assert self._built is not None
            return self._built
        if self._error is not None and self.media == dict(media):
            raise self._error
        # Sized for fewer media than the job carries, or begun for other media than the
        # job's and failed: the job's own start says (and its error is the one raised).
        self.close()
        self.media = dict(media)
        self._thread, self._abandoned, self._error = None, False, None
        return self.engine(media)

    def close(self) -> None:
        """Close what the start built, without waiting for a start still under way (it
        closes what it builds once done, and an engine's processes end with this one at
        the latest): the job stopped before it needed its engine (its inputs refused,
        Ctrl-C, nothing left to run). An engine kept in this process for earlier jobs
        (``mmbatch.engine.registry``) is theirs too, and stays open."""
        with self._lock:
            self._abandoned = True
            built, self._built = self._built, None
        close = getattr(built[0], "close", None) if built is not None and self._own else None
        if close is not None:
            close()


@contextmanager
def begun_while_reading(
    config: EngineConfig, media: dict[Modality, int] | None, requests: int | None
) -> Iterator[EngineConfig | EngineStart]:
    """The engine for ``config`` begun now (``EngineStart.begin``) for a job of about
    ``requests`` carrying ``media`` per prompt, while the caller reads its inputs inside the
    ``with``; closed when the ``with`` ends without the job having taken it (its inputs
    refused, Ctrl-C, nothing left to run). ``config`` itself where ``media`` is None (the
    caller begins nothing: a dry run, a resumed output, an engine started elsewhere) or
    ``requests`` is: a job of unknown size would be laid out as a small one (one engine per
    GPU, graphs up to vLLM's largest batch), so its engine starts once the inputs are listed
    and counted."""
    if media is None or requests is None:
        yield config
        return
    start = EngineStart.begin(config, media, requests)
    try:
        yield start
    finally:
        if not start.taken:  # the job's, once taken: it ends as any job's engine does
            start.close()


def _shared(host: Host, media: dict[Modality, int], layout: Layout) -> tuple[Engine, Layout]:
    from mmbatch.engine.registry import shared_engine_and_layout

    return shared_engine_and_layout(host, media, layout)
