"""The parity stage: the benchmark shape's checked calls (where it can run here; on the CPU, else the largest smaller
shape of the reference's own family that fits), the members of its shape family (--shapes), then the declared
cases. It orders the parts of kp.judge.parity and kp.judge.family_parity over the judge's run."""

from __future__ import annotations

import time

from kp.judge.calls import drop_input_buffers
from kp.judge.family import scale_to_fit
from kp.judge.family_parity import parity_shapes, scale_workers
from kp.judge.members import said_sizes
from kp.judge.parity import parity_bench, parity_cases
from kp.judge.plan import cpu_bench_refusal, cpu_need, host_budget


def stage_parity(run, rec: dict, init) -> None:
    """Parity on the benchmark shape (where it can run here), then the declared cases."""
    run.t_parity = time.perf_counter()
    room = None if run.device == "cuda" else host_budget()
    why_not = None if room is None else cpu_bench_refusal(run.fp, room, backward=run.backward)
    if why_not:  # on the CPU: the largest smaller shape of the reference's own family that fits
        scaled = scale_to_fit(run.ref, lambda fp: cpu_bench_refusal(fp, room, backward=run.backward) is None)
        if scaled:
            bench, need = run.fp["shapes"], cpu_need(run.fp, run.backward)
            run._fp = run.ref.footprint(run.device, run.train)
            said = said_sizes(scaled)
            run.notes.append(f"judged at {run.fp['shapes']}")  # the record: how and why in full
            rec["not_proven"] = (
                f"not proven at {bench}: {need / 2**30:.1f} GiB needed, {room / 2**30:.1f} "
                f"here"
            )  # an acceptance's caution (kp.observe.report)
            rec["judged_shape_why"] = f"{why_not}; {said}"
            why_not = None
            scale_workers(run, scaled)
    run.bench_parity = why_not is None
    rec["judged_shape"] = run.fp["shapes"] if run.bench_parity else None  # rec["shape"]: the benchmark's
    if run.bench_parity:
        parity_bench(run, init)
        drop_input_buffers(run)
        rec["probes"] = run.probes.record()
        weak = run.probes.note()
        if weak:
            run.notes.append(weak)
            run.log(f"{run.ref.name}: {weak}")
        if run.shapes:
            parity_shapes(run, rec, init)
    else:
        rec["notes"] = f"{why_not}; no smaller shape of its family: {run.ref.no_smaller_shape}"
        run.no_room = (
            f"its shape needs {cpu_need(run.fp, run.backward) / 2**30:.1f} GiB of host memory, {room / 2**30:.1f} "
            f"GiB here, none smaller fits"
        )  # the verdict's short form
    parity_cases(run)
    drop_input_buffers(run)
