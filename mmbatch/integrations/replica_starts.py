"""Each Ray replica's starts, counted for the job: when to stop starting one again, and what
its restarts took of the job's time.

Ray restarts a replica (an actor of Ray Data's pool) whose process dies, without limit: a
replica whose process dies at every start (killed for memory while it loads the model, a
driver that crashes the process) would be started again forever, each time loading the
model (minutes on a GPU) and dying, while the job neither goes on nor stops. So each start
asks first how its replica's process died before (``ReplicaStarts.begin``), and a replica
that died ``MAX_DEATHS_IN_A_ROW`` times in a row without finishing a batch is not started
again: its start says why instead, and the job stops on it, loudly, its rows saved.

Ray keeps a replica's actor id across its restarts; that id names the replica here. Nothing
here imports ray: the job's tally actor (``replica_tally.ReplicaTally``) holds one
``ReplicaStarts``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_DEATHS_IN_A_ROW = 2
"""Deaths of one replica's process in a row, with no batch finished between them, after
which it is not started again and the job stops.

One death is what a restart is for: a node lost, memory taken by a neighbour for a moment, a
rare crash; the job goes on once the engine is up again. A second before any batch is
finished says the replica itself cannot run: its start dies (the model does not fit the
memory it is given), or a batch kills every engine it reaches. Starting it a third time
would load the model once more for nothing, minutes each time on a GPU. Two, as the local
runner gives up a request that was in flight at two deaths. Counted in a row, not in all: a
long job whose replicas die now and then, each time finishing batches in between, goes on
however many times that happens."""


@dataclass
class _Start:
    """One start of a replica's process: when its actor began (the wall clock), when its
    engine was ready (None: not yet, or never), and which process it was (``NODE:PID``)."""

    began: float
    process: str
    ready: float | None = None


@dataclass
class _Replica:
    starts: list[_Start] = field(default_factory=list)
    deaths_in_a_row: int = 0
    """Its process's deaths since its last finished batch (or its first start)."""
    died_starting: int = 0
    """Of those, the deaths before its engine was ready."""


class ReplicaStarts:
    """The starts of a job's replicas, each named by its Ray actor id."""

    def __init__(self) -> None:
        self._replicas: dict[str, _Replica] = {}

    def begin(self, replica: str, at: float, process: str) -> str | None:
        """A start of ``replica`` (in ``process``, at ``at``). Every start but its first
        follows a death of its process. None: start its engine; else why it must not be
        started again, in one line (its deaths in a row, and where they struck)."""
        record = self._replicas.setdefault(replica, _Replica())
        if record.starts:
            last = record.starts[-1]
            record.deaths_in_a_row += 1
            record.died_starting += last.ready is None
        record.starts.append(_Start(at, process))
        deaths = record.deaths_in_a_row
        if deaths < MAX_DEATHS_IN_A_ROW:
            return None
        starting = record.died_starting
        where = (
            "each time while its engine was starting (killed for memory as it loaded the "
            "model, for instance)"
            if starting == deaths
            else "each time while it ran a batch"
            if starting == 0
            else f"{starting} of them while its engine was starting"
        )
        last_process = record.starts[-2].process
        return (
            f"a Ray replica's process died {deaths} times in a row without finishing a batch, "
            f"{where}; it is not started again (the last was process {last_process})"
        )

    def ready(self, replica: str, at: float) -> None:
        """``replica``'s engine, of its latest start, was ready at ``at``."""
        record = self._replicas.get(replica)
        if record is not None and record.starts:
            record.starts[-1].ready = at

    def finished_batch(self, replica: str) -> None:
        """``replica`` finished a batch: its deaths so far are no longer in a row."""
        record = self._replicas.get(replica)
        if record is not None:
            record.deaths_in_a_row = record.died_starting = 0

    def restarts(self) -> tuple[int, float]:
        """The restarts (every start of a replica but its first) and their seconds: each
        from its actor's start to its engine ready, or, where it died before, to the next
        start."""
        count, seconds = 0, 0.0
        for record in self._replicas.values():
            starts = record.starts
            for index, start in enumerate(starts[1:], start=2):
                count += 1
                after = starts[index] if index < len(starts) else None
                end = start.ready if start.ready is not None else after.began if after else None
                if end is not None:
                    seconds += max(0.0, end - start.began)
        return count, seconds
