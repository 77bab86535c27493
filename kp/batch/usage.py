"""What a batch used of its host, said at its end: each GPU's utilisation (nvidia-smi's samples) and how busy the
cores it may use were (the kernel's count): a run whose cores were busy all along is bound by them (its candidates'
builds, say), one whose GPUs idled with cores to spare by something else."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path


class GpuUse:
    """GPU utilisation over a batch: `nvidia-smi` asked every `every_s` seconds in a thread (the share of time a
    kernel ran, per GPU, as the driver counts it). Where there is no nvidia-smi, nothing is measured and `line` says
    so."""

    def __init__(self, gpus: list[str | None], every_s: float = 2.0):
        self.ids = sorted({g for g in gpus if g is not None}, key=lambda g: (not g.isdigit(), g.zfill(8)))
        self.samples: dict[str, list[float]] = {g: [] for g in self.ids}
        self.smi = shutil.which("nvidia-smi") if self.ids else None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(every_s,), daemon=True) if self.smi else None
        if self.thread:
            self.thread.start()

    def _run(self, every_s: float) -> None:
        while not self.stop.wait(every_s):
            try:
                text = subprocess.run(
                    [
                        self.smi,
                        "--query-gpu=index,uuid,utilization.gpu",
                        "--format=csv,noheader,nounits",
                        "-i",
                        ",".join(self.ids),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for ln in text.splitlines():  # a GPU named by its index or its UUID (CUDA_VISIBLE_DEVICES says either)
                idx, uuid, util = (f.strip() for f in (ln.split(",") + ["", ""])[:3])
                g = idx if idx in self.samples else uuid if uuid in self.samples else None
                if g is not None and util.isdigit():
                    self.samples[g].append(float(util))

    def line(self) -> str:
        if self.thread:
            self.stop.set()
            self.thread.join(15)
        if not self.ids:
            return "GPU utilisation: no GPU in this run"
        if not self.smi:
            return "GPU utilisation: not measured (no nvidia-smi here)"
        got = {g: v for g, v in self.samples.items() if v}
        if not got:
            return "GPU utilisation: not measured (the run was shorter than one sample)"
        return "GPU utilisation (nvidia-smi, mean over the run): " + ", ".join(
            f"GPU {g} {sum(v) / len(v):.0f}%" for g, v in got.items()
        )


class CpuUse:
    """How busy the cores this process may use were since it was made (/proc/stat: every process's time on them, this
    run's and anything else's; idle and waiting for I/O count as not busy). Where there is no /proc/stat, nothing is
    measured and `line` says so."""

    def __init__(self):
        try:
            self.cores = sorted(os.sched_getaffinity(0))
        except AttributeError:
            self.cores = []
        self.start = self._read()

    def _read(self) -> tuple[int, int] | None:
        """(busy, all) clock ticks of this process's cores so far."""
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return None
        want, busy, total = {f"cpu{c}" for c in self.cores}, 0, 0
        for ln in text.splitlines():
            f = ln.split()
            if f and f[0] in want:
                v = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
                total += sum(v)
                busy += sum(v) - v[3] - v[4]
        return (busy, total) if total else None

    def busy(self) -> float | None:
        """The share of the time its cores were busy since it was made; None where not measured."""
        now = self._read()
        if self.start is None or now is None or now[1] <= self.start[1]:
            return None
        return (now[0] - self.start[0]) / (now[1] - self.start[1])

    def line(self) -> str:
        b = self.busy()
        if b is None:
            return "CPU: not measured (no /proc/stat here)"
        return f"CPU (its {len(self.cores)} cores, /proc/stat): {100 * b:.0f}% busy"
