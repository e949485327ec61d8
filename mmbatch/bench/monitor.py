"""What the machine did while a workload or a whole process ran: the GPU busy share, sampled
through NVML (absent NVML: None), the host's CPU busy share, and the CPU time of each kind of
process of the side, through psutil.

A fed engine whose GPU still idles is held back by something on the host; the CPU seconds
say by what. vLLM's engine core runs its scheduler loop on one thread: that thread near
100% busy is the loop being the bound, the same thread slower beside busy decode workers is
the side's helpers taking its cores.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple


def gpu_lines(query: str, timeout: float = 30.0) -> list[str] | None:
    """What ``nvidia-smi --query-gpu=QUERY`` says, a line per GPU, its numbers without units
    (MiB for memory); None where there is no nvidia-smi, or it fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_names() -> list[str]:
    """The machine's GPUs as a report names them (``NVIDIA H100 80GB HBM3, 81559 MiB``), or
    ``none (CPU)``."""
    return [f"{line} MiB" for line in gpu_lines("name,memory.total") or []] or ["none (CPU)"]


class LoadSample(NamedTuple):
    """One moment's load: its wall-clock time, the GPUs' mean utilisation (0..100; None
    without NVML) and the host's CPU busy share (0..100, all its cores)."""

    at: float
    gpu: float | None
    cpu: float


class MachineLoad:
    """Samples every GPU's utilisation (through NVML; without it, none) and the host's CPU
    busy share (all its cores, psutil) every ``interval`` seconds between start and stop,
    each sample with its wall-clock time: a whole run's share (``busy_share``), or any span
    of it read afterwards (``shares_between``), such as a whole process's start-up and work."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self.interval = interval
        self._cpu_percent = psutil.cpu_percent
        self.samples: list[LoadSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except Exception:
            self._handles = []

    def __enter__(self) -> MachineLoad:
        self._cpu_percent(None)  # the first call starts psutil's count; it returns 0.0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            gpu = None
            if self._handles:
                rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
                gpu = sum(rates) / len(rates)
            self.samples.append(LoadSample(time.time(), gpu, self._cpu_percent(None)))

    @property
    def busy_share(self) -> float | None:
        """The GPUs' mean utilisation over the samples, 0..1; None without NVML or samples."""
        return self.shares_between(0.0, float("inf"))["gpu_busy"]

    def shares_between(self, start: float, end: float) -> dict[str, float | None]:
        """The GPUs' mean utilisation (``gpu_busy``) and the host's CPU busy share
        (``cpu_busy``), 0..1, over the samples taken between the wall-clock times ``start``
        and ``end``; None where nothing was sampled (no NVML: no GPU share)."""
        within = [(gpu, cpu) for at, gpu, cpu in self.samples if start <= at <= end]
        gpus = [gpu for gpu, _ in within if gpu is not None]
        cpus = [cpu for _, cpu in within]
        return {
            "gpu_busy": round(sum(gpus) / len(gpus) / 100, 3) if gpus else None,
            "cpu_busy": round(sum(cpus) / len(cpus) / 100, 3) if cpus else None,
        }


ENGINE_CORE = "EngineCor"
"""What vLLM's engine-core process calls itself (``VLLM::EngineCore``; the kernel keeps
15 characters of a process name)."""


@dataclass(frozen=True)
class _Usage:
    role: str
    cpu: float
    main_thread: float


class CpuMonitor:
    """CPU seconds of this process and all its descendants between start and stop, summed by
    role: ``driver`` (this process: naive's whole engine front end, or mmbatch's job),
    ``engine_core`` (vLLM's engine-core processes) and ``engine_core_main_thread`` (their
    scheduler loop), ``engine_workers`` (vLLM's GPU workers, under tensor parallelism),
    ``replicas`` (mmbatch's engine processes: any other process that started an engine core)
    and ``helpers`` (the rest: decode workers). Sampled every ``interval`` seconds, so that a
    process that ends during the run still counts up to its last sample."""

    def __init__(self, interval: float = 0.5) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(os.getpid())
        self.interval = interval
        self._first: dict[int, _Usage] = {}
        self._last: dict[int, _Usage] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuMonitor:
        self._first = self._sample()
        self._last = dict(self._first)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._last.update(self._sample())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._last.update(self._sample())

    def seconds(self) -> dict[str, float]:
        """CPU seconds per role over the run (a process started during it counts whole)."""
        totals: dict[str, float] = {}
        for pid, last in self._last.items():
            first = self._first.get(pid, _Usage(last.role, 0.0, 0.0))
            totals[last.role] = totals.get(last.role, 0.0) + last.cpu - first.cpu
            if last.role == "engine_core":
                main = last.main_thread - first.main_thread
                totals["engine_core_main_thread"] = (
                    totals.get("engine_core_main_thread", 0.0) + main
                )
        return {role: round(value, 2) for role, value in sorted(totals.items())}

    def _sample(self) -> dict[int, _Usage]:
        psutil = self._psutil
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return {}
        names: dict[int, str] = {}
        parents: dict[int, int] = {}
        for process in processes:
            try:
                name, parent = process.name(), process.ppid()
            except psutil.Error:
                continue
            names[process.pid], parents[process.pid] = name, parent
        engine_parents = {parents[pid] for pid, name in names.items() if ENGINE_CORE in name}
        usage: dict[int, _Usage] = {}
        for process in processes:
            pid = process.pid
            if pid not in names:
                continue
            role = _role(pid == self._root.pid, names[pid], pid in engine_parents)
            try:
                main = 0.0
                if role == "engine_core":  # read before the process's total, never above it
                    main = sum(
                        t.user_time + t.system_time for t in process.threads() if t.id == pid
                    )
                times = process.cpu_times()
            except psutil.Error:
                continue
            usage[pid] = _Usage(role, times.user + times.system, main)
        return usage


def _role(root: bool, name: str, started_an_engine: bool) -> str:
    if root:
        return "driver"
    if ENGINE_CORE in name:
        return "engine_core"
    if name.startswith("VLLM") and "Worker" in name:
        return "engine_workers"
    return "replicas" if started_an_engine else "helpers"
