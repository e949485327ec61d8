"""A decode job whose worker process dies on the bytes ``b"crash"`` (as a decoder crashing
in C on hostile input would) and takes ``SLOW_S`` over any other, so that bystanders are in
flight when it dies. Imported by the pool's workers when they unpickle a job, which
registers its decoder there too."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from mmbatch.media import decode as decode_module
from mmbatch.media.decode import Decoded, ImageJob
from mmbatch.types import MediaItem

SLOW_S = 0.4


@dataclass(frozen=True)
class CrashingJob(ImageJob):
    pass


def _decode(job: CrashingJob) -> Decoded:
    if job.data == b"crash":
        os._exit(70)
    time.sleep(SLOW_S)
    return {job.key: MediaItem("image", job.key, bytes(job.data))}


decode_module._DECODERS[CrashingJob] = _decode
