"""The escape check's arithmetic, on the profiler's GPU activities of one call between marker kernels and on the host
clock around it: the activities outside the window, how long the call's own work kept the GPU busy (and, for a
training step with a marker between its passes, the forward's part), the host clock's excess over the CUDA events,
and the threshold past which that excess is work that escaped the timed stream."""

from __future__ import annotations

from statistics import median_high


def window_violations(events: list[dict], marker: str) -> tuple[list[dict], tuple[float, float] | None]:
    """GPU activities outside the window between the first and the last `marker` kernel (trace microseconds).
    Returns (violations, window); window None when the markers are missing (that itself is a failure)."""
    marks = [e for e in events if e["name"] == marker]
    if len(marks) < 2:
        return [], None
    lo = marks[0]["ts"] + marks[0]["dur"]
    hi = marks[-1]["ts"]
    inside = [e for e in events if e is not marks[0] and e is not marks[-1]]
    bad = [e for e in inside if e["ts"] < lo - 1.0 or e["ts"] + e["dur"] > hi + 1.0]  # 1 us: trace rounding
    return bad, (lo, hi)


def busy_ms(events: list[dict], marker: str, window: tuple[float, float] | None) -> float:
    """How long the call's own GPU activities (those inside the marker window) kept the GPU busy, in ms: the union
    of their intervals, so launch gaps do not count and overlapping streams count once. The profiler's activity
    records (CUPTI) are made outside Python; a timed median far below this did not measure the whole call."""
    if window is None:
        return 0.0
    lo, hi = window
    spans = sorted((max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events if e["name"] != marker)
    spans = [(a, b) for a, b in spans if b > a]  # clipped to the window: what lies outside it is the escape check's
    total, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1e3


def forward_busy_ms(events: list[dict], marker: str, window: tuple[float, float] | None) -> float | None:
    """A training step profiled with a marker kernel between its forward and its backward (kp.worker.profiling): how
    long the forward's own GPU activities kept the GPU busy, from the window's start to that middle marker (busy_ms's
    union); None without a middle marker."""
    marks = sorted(e["ts"] for e in events if e["name"] == marker)
    if window is None or len(marks) < 3:
        return None
    return busy_ms(events, marker, (window[0], marks[len(marks) // 2]))


def host_clock_excess_ms(samples: list[tuple[float, ...]]) -> float:
    """samples: (wall ms from before the start event to after a device-wide synchronize, event ms, enqueue ms[,
    ms the measuring thread waited for a CPU while it synchronized]). Work on the timed stream finishes within
    max(enqueue, event) plus a synchronize's latency; the median excess beyond that is time the events did not see.
    The wait for a CPU is not: on a host whose cores are all busy (a batch's builds beside its judges) a thread that
    waits out a call of a few ms is taken off its core and gets it back a scheduler slice later, every call (an
    honest 3.5 ms softmax showed 4.0 ms of excess so, its GPU to itself)."""
    ex = [s[0] - max(s[1], s[2]) - (s[3] if len(s) > 3 else 0.0) for s in samples]
    return median_high(ex) if ex else 0.0


def run_queue_ms() -> float:
    """Milliseconds the calling thread has waited on a run queue (for a CPU) since it started: the kernel's
    schedstat (/proc/thread-self/schedstat, its second field, in ns); 0.0 where the kernel does not keep it, so a
    difference of two reads is then 0 and the host clock is taken as it is."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


def escape_threshold_ms(event_ms: float) -> float:
    """Excess over which the host clock says work escaped: 0.2 ms (synchronize + Python latency seen on an H200 is
    tens of us) plus 20% of the call."""
    return 0.2 + 0.2 * event_ms
