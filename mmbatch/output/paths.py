"""Every file a job's output writes, named in this module only.

An output is its rows at ``OUT`` (a JSONL or Parquet file, a datasets folder, a folder of
shards, or a folder of Ray's row files) and files beside it, each named ``OUT`` plus a
suffix, so that a folder of outputs lists each job's files together:

    OUT.job.json          the job's fingerprint: whose rows these are (mmbatch.output.resume)
    OUT.summary.json      the counts over the whole output, the last run's speed
    OUT.quarantine.jsonl  the failed inputs and why (mmbatch.output.stats)
    OUT.rows.jsonl        a columnar output's rows as they finish (mmbatch.output.tables)
    OUT.vllm.log          vLLM's log, where a command sends it
    .OUT.tmp              a columnar output being written, moved into place when whole

Files replaced whole go through temporaries named ``.NAME.<random>.tmp`` in the same folder
(``mmbatch.jsonl.write_atomic``); a job killed meanwhile leaves them behind, and the next
run removes them (``OutputPaths.replaced`` lists whose).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FileFormat = Literal["jsonl", "parquet", "datasets", "webdataset"]
"""What the rows at ``OUT`` are (``mmbatch.output.formats`` reads and writes each)."""
FILE_FORMATS: tuple[FileFormat, ...] = ("jsonl", "parquet", "datasets", "webdataset")


@dataclass(frozen=True)
class OutputPaths:
    """The paths of one output: its rows, and every file the job writes beside them."""

    rows: Path
    """The output itself, as ``--out`` names it."""
    format: FileFormat = "jsonl"
    row_folder: bool = False
    """The rows are a folder of row files that Ray's writers add to and resume reads in
    place (``mmbatch.output.folders``), not one output this process writes."""

    @property
    def record(self) -> Path:
        """The fingerprint of the job writing the rows (``OUT.job.json``)."""
        return self._beside(".job.json")

    @property
    def summary(self) -> Path:
        """``OUT.summary.json`` (a folder's sits next to the folder)."""
        return self._beside(".summary.json")

    @property
    def quarantine(self) -> Path:
        """The failed inputs of the job, listed (``OUT.quarantine.jsonl``)."""
        return self._beside(".quarantine.jsonl")

    @property
    def vllm_log(self) -> Path:
        """Where a command sends vLLM's log unless ``-v`` (``OUT.vllm.log``)."""
        return self._beside(".vllm.log")

    @property
    def spool(self) -> Path:
        """The JSONL file a columnar output's rows go to as they finish (``OUT.rows.jsonl``)."""
        return self._beside(".rows.jsonl")

    @property
    def temporary(self) -> Path:
        """Where a columnar output is written before it is moved into place (``.OUT.tmp``)."""
        return self.rows.with_name(f".{self.rows.name}.tmp")

    @property
    def spooled(self) -> bool:
        """Whether the rows go through the spool: a columnar output this process writes."""
        return self.format != "jsonl" and not self.row_folder

    @property
    def progress(self) -> Path:
        """What resume reads and the sink appends to: the spool of a columnar output, else
        the rows themselves."""
        return self.spool if self.spooled else self.rows

    @property
    def replaced(self) -> tuple[Path, ...]:
        """The files written whole through temporaries, which a killed job may have left."""
        return (self.rows, self.record, self.quarantine, self.summary, self.spool)

    def _beside(self, suffix: str) -> Path:
        return self.rows.with_name(self.rows.name + suffix)
