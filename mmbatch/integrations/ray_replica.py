"""The Ray replica: one actor of a ``--ray`` job, with its engine(s), running each batch of
picture groups Ray Data hands it as a ``Job`` of the local runner.

The driver (``ray_data``) builds the Dataset, checks the settings and writes the output; this
module is what runs inside each actor, from the settings the driver sends it (``RayJob``): it
lays out and starts its engines as the local runner does, tells the job's tally
(``replica_tally``) what its rows do not say, and names its process in the engine's log, the
one to look at or end when a replica misbehaves. It imports ray only inside the functions
that use it, as the driver's module does.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.clock import milestone, milestones_wall
from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import FatalEngineError, MmbatchError
from mmbatch.integrations.ray_rows import flat_schema, unpack_groups
from mmbatch.integrations.replica_tally import ReplicaFigures
from mmbatch.jobs import Job, rows_of, start_in_memory
from mmbatch.media.options import MediaOptions
from mmbatch.output.rows import FLAT, RowShape
from mmbatch.types import Modality, Request, Sampling

if TYPE_CHECKING:
    import pyarrow as pa

    from mmbatch.recipe.spec import Recipe


@dataclass(frozen=True)
class RayJob:
    """What every replica needs to make each of its batches a ``Job``: settings only."""

    engine: EngineConfig
    sampling: Sampling = field(default_factory=Sampling)
    media: MediaOptions = field(default_factory=MediaOptions)
    prompt: str | None = None
    """The prompt of rows whose ``prompt`` is missing or null."""
    recipe: Recipe | None = None
    """A recipe job (``mmbatch run``): each input row is an item, asked every question of
    the recipe, with its sampling and [media] options; its row holds every answer."""
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    """What makes two runs the same job; kept in the folder's job record."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """What the summary records about the job."""
    requests_per_replica: int | None = None
    """The requests each replica runs (None: unknown), which its engines are laid out for
    as the local runner lays out a job of that size: engines per GPU, compiled or not."""
    omp_threads: str | None = field(default_factory=lambda: os.environ.get("OMP_NUM_THREADS"))
    """The user's ``OMP_NUM_THREADS`` where the job was made (None: not set), which each
    replica's process takes instead of Ray's (``threads_as_a_local_process``)."""

    @property
    def shape(self) -> RowShape:
        if self.recipe is None:
            return FLAT
        from mmbatch.recipe.requests import recipe_shape

        return recipe_shape(self.recipe)

    def batch_job(self, items: Sequence[Request]) -> Job:
        """The job of ``items``: a batch's, or on the driver every input's."""
        if self.recipe is None:
            return Job(items, self.sampling, self.media)
        from mmbatch.recipe.requests import item_requests, recipe_media

        recipe = self.recipe
        requests = item_requests(items, recipe)
        return Job(requests, recipe.sampling, recipe_media(recipe), self.shape)


class EngineReplica:
    """One Ray actor: one engine, and each batch of groups run as a ``Job`` on it.

    ``__call__`` is a coroutine, so Ray Data hands an actor several batches at once; they
    all go to the actor's one pipeline (``mmbatch.pipeline``), whose engine and decoded
    media live as long as the actor: the engine does not drain between batches, and a
    picture seen in an earlier batch is neither decoded nor encoded again.
    """

    def __init__(self, job: RayJob, tally: Any | None = None, engine: Engine | None = None) -> None:
        """Ray passes ``job`` and the run's ``ReplicaTally`` actor (None: nothing is told);
        ``engine`` lets a test run the bookkeeping in-process.

        An engine that cannot start fails the actor's first batch, not its constructor: an
        error raised here reaches the driver only as "the actor died", an error raised from
        a batch as itself (``media_groups`` asks Ray Data for that)."""
        from mmbatch.engine.torch_threads import threads_as_a_local_process

        milestone("actor_started")
        threads_as_a_local_process(job.omp_threads)
        self.job = job
        self.tally = tally
        # This actor among the job's, by its process, and by its Ray actor id: the same
        # across the restarts of its process.
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.replica = _actor_id() if tally is not None else self.name
        self.failed: MmbatchError | None = None
        if engine is None:
            self.failed = self._not_again()
        if engine is None and self.failed is None:
            from mmbatch.lifetime import orphan_resource_tracker

            # Ray kills this worker's direct children as it ends: the tracker, which unlinks
            # the shared memory vLLM's engine core leaves then, must not be one of them.
            orphan_resource_tracker()
            say_replica_process(job.engine.log_file)
            kind = job.recipe.media.kind if job.recipe else "image"
            try:
                engine = _replica_engine(job, {kind: 1}, tally)
                milestone("engine_ready")
            except MmbatchError as exc:
                self.failed = exc
        self.engine = engine
        # When this replica's engine was ready, by the wall clock: the driver's summary
        # splits start-up from work by the first replica's (``startup_split``), and counts
        # a restart's start-up apart from the work (``ReplicaStarts.restarts``).
        self.ready_at = time.time()
        if tally is not None:
            if self.failed is None:
                tally.engine_ready.remote(self.replica, self.ready_at)
            # Its start-up's moments, which the driver's summary shows among its own
            # (``startup_phases``).
            tally.started.remote(self.replica, milestones_wall())

    def _not_again(self) -> MmbatchError | None:
        """Why this replica's engine must not be started again (``ReplicaStarts``: its
        process died again and again), asked of the job's tally before anything else; the
        error its batches then raise, or None (no tally: nothing is counted)."""
        if self.tally is None:
            return None
        import ray

        why = ray.get(self.tally.begin.remote(self.replica, time.time(), self.name))
        if why is None:
            return None
        log = self.job.engine.log_file
        return FatalEngineError(why + (f"; its engine's log: {log}" if log else ""))

    async def __call__(self, batch: pa.Table) -> pa.Table:
        import asyncio

        import pyarrow as pa

        if self.failed is not None:  # a copy: Ray Data adds a note to the error it raises
            raise type(self.failed)(*self.failed.args)
        assert self.engine is not None
        items = unpack_groups(batch, self.job.prompt)
        submission = start_in_memory(self.job.batch_job(items), self.engine)
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        submission.on_done(lambda: loop.call_soon_threadsafe(finished.set_result, None))
        await finished
        rows, stats = rows_of(submission)
        written = sorted(str(row["id"]) for row in rows)
        if written != sorted(item.id for item in items):
            raise RuntimeError(
                f"bug: a batch of {len(items)} items gave {len(written)} rows "
                "that do not match its ids one to one"
            )
        if self.tally is not None and items:
            figures = ReplicaFigures.of(stats)
            await self.tally.add.remote(min(written), figures, self.ready_at, self.replica)
            # Its engines started again inside it (an engine process that died), which the
            # job's summary counts as a local job's.
            await self.tally.engines_restarted.remote(self.name, self.engine.restarts())
            await self.tally.engine_caches.remote(self.name, stats.cache)
            await self.tally.started.remote(self.replica, milestones_wall())  # its first row
        if self.job.recipe is not None:
            # A recipe row's answers take the recipe's shape (names, parsed JSON): inferred.
            return pa.Table.from_pylist(rows)
        return pa.Table.from_pylist(rows, schema=flat_schema())


def _actor_id() -> str:
    """The Ray actor this process runs, by its id, which Ray keeps across its restarts."""
    import ray

    return str(ray.get_runtime_context().get_actor_id())


REPLICA_PROCESS = "mmbatch: a Ray replica runs in process {pid} on {node}"
"""The engine log's line naming each replica's process, as it starts (again, when Ray
restarts it)."""


def say_replica_process(log: str | None) -> None:
    """Say in the engine's log (``log``; None: stderr, Ray's worker log) which process this
    replica is: the one to look at, or end, when a replica misbehaves. Ray's process title
    names Ray Data's worker class, the same for every map in every job."""
    import socket

    line = REPLICA_PROCESS.format(pid=os.getpid(), node=socket.gethostname()) + "\n"
    if log is None:
        sys.stderr.write(line)
        return
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as file:
        file.write(line)


def _replica_engine(
    job: RayJob, media_per_prompt: dict[Modality, int], tally: Any | None
) -> Engine:
    """The engine(s) of one replica, laid out on the actor's GPUs for its share of the job
    as the local runner lays out a job (``Host.layout``): a job of thousands of pictures
    gets two engines on a large GPU and starts them eager, where one engine compiled for
    every batch size took minutes to start and left its GPU waiting on its one thread. The
    layout is said as the local runner says it, here and (through the tally) in the
    driver's summary.

    Every engine runs in an engine process of the actor (``ReplicaEngine``), one engine too,
    as the local runner runs its engines: an engine that dies is started again inside the
    replica, the requests it held become suspects, and a request in flight at two of its
    deaths becomes the one error row, while the job goes on. One engine once ran in the
    actor's own process, Ray's restart of the actor standing for the engine's: but a
    request that kills its engine then killed the actor, Ray ran its batch again on the
    next one, and after two deaths in a row (``replica_starts``) the whole job stopped on
    one bad request. Now the actor dies only of what kills the actor itself (a node lost,
    its memory), which Ray's restart is for. Its engine processes end with it: each
    watches its parent and ends its process group (vLLM's engine core with it) once the
    actor is gone (``mmbatch.lifetime``)."""
    from mmbatch.engine import builder

    host = builder.read_host(job.engine)
    layout = host.layout(job.requests_per_replica)
    engine = builder.start_engine(host, media_per_prompt, layout)
    print(f"mmbatch: {layout.describe()}", file=sys.stderr)
    if tally is not None:
        tally.laid_out.remote(layout.describe())
    return engine
