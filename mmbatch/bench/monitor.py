"""GPU busy share, sampled through NVML while a workload runs (absent NVML: None)."""

from __future__ import annotations

import threading
from typing import Any


class GpuMonitor:
    """Samples every GPU's utilisation every ``interval`` seconds between start and stop."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except Exception:
            self._handles = []

    def __enter__(self) -> GpuMonitor:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
            self._samples.append(sum(rates) / len(rates))

    @property
    def busy_share(self) -> float | None:
        """Mean utilisation over the samples, 0..1; None without NVML or samples."""
        if not self._samples:
            return None
        return sum(self._samples) / len(self._samples) / 100
