"""Parity over the reference's shape family (--shapes N): the same stateful sequence of checked calls at other
members of the family (kp.judge.family), the sizes set in every worker, a row right at the benchmark's shape and
wrong at a member rejected naming both. Functions of the judge's run (kp.judge.driver.Judge)."""

from __future__ import annotations

import torch

from kp.errors import GpuMemoryShort, ReferenceRaised, Rejected, UsageError, cuda_broken
from kp.judge.family import scale_to_fit
from kp.judge.members import said_sizes
from kp.judge.plan import cpu_bench_refusal, float64_peak, free_gpu_bytes, host_budget, memory_need
from kp.judge.calls import drop_input_buffers
from kp.judge.parity import parity_bench


def parity_shapes(run, rec: dict, init) -> None:
    """--shapes N: the same stateful sequence of checked calls (fresh inputs, weight changes, derived inputs) at
    N other members of the reference's shape family (kp.judge.family), each with the rows built again and the
    candidate's own copies of the sizes set alike (the worker's scale command). A row right at the benchmark's shape
    and wrong at a member is rejected naming both. A member the host or GPU has no room for, or where the reference
    itself raises, is skipped and said; with a count, the family's next member is taken in its place. A call that
    runs out of GPU memory because other processes took it is no verdict for the whole job, never a skip: a
    candidate wrong only at the largest member would otherwise be accepted whenever the GPU was shared."""
    members, none = run.ref.family(run.shapes, spares=True, train=run.train)
    wanted = run.shapes if isinstance(run.shapes, int) else len(members)
    bench, bench_fp, bench_refs = run.fp["shapes"], run._fp, run.refs
    rec["family"] = []
    if not members:
        said = run.shapes if isinstance(run.shapes, int) else ",".join(m.replace(" ", "-") for m in run.shapes)
        run.skip(f"other shapes (--shapes {said}): {none}")
        return
    if run.ref.held_sizes:
        run.notes.append(
            f"--shapes: {', '.join(run.ref.held_sizes)} held at the file's value (its model takes no other)"
        )
    g = vars(run.ref.module)
    judged, refused = {bench}, 0
    for member, sizes in members:
        if not run.live() or len(rec["family"]) - refused == wanted:
            break
        g.update({k: new for k, (_, new) in sizes.items()})
        entry = {"member": member, "sizes": {k: new for k, (_, new) in sizes.items()}}
        rec["family"].append(entry)
        try:
            try:
                run._fp = run.ref.footprint(run.device, run.train)
            except UsageError as e:  # the reference raised there, measuring its footprint
                refused += _refused(run, entry, e, f"{member} sizes ({said_sizes(sizes)})")
                continue
            except torch.OutOfMemoryError:  # a model meta cannot run, measured by a real forward: no room
                torch.cuda.empty_cache()
                entry["skipped"] = "no room: the reference's forward there ran out of GPU memory"
                run.skip(f"at {member} sizes ({said_sizes(sizes)}): {entry['skipped']}")
                continue
            no_room = no_room_for(run.fp, bench_fp, run.device, run.f64_device, len(run.rows), run.backward)
            # the host's room: a smaller member of the same kind, as the benchmark's own shape is (its row length
            # kept)
            if no_room and run.device != "cuda":
                fitted = scale_to_fit(
                    run.ref, lambda fp: cpu_bench_refusal(fp, host_budget(), backward=run.backward) is None
                )
                if fitted:
                    sizes = {**sizes, **{k: (sizes[k][0] if k in sizes else a, b) for k, (a, b) in fitted.items()}}
                    entry["sizes"] = {k: new for k, (_, new) in sizes.items()}
                    entry["scaled"] = f"{no_room}; {said_sizes(fitted)}"
                    run._fp = run.ref.footprint(run.device, run.train)
                    no_room = None
            entry["shape"] = shape = run.fp["shapes"]
            if shape in judged:  # scaled to fit, it is a shape judged already
                no_room = f"scaled to fit the host it is {shape}, judged already"
            judged.add(shape)
            if no_room:
                entry["skipped"] = no_room
                run.skip(f"at {shape} ({member} sizes): {no_room}")
                continue
            if entry.get("scaled"):
                run.notes.append(f"{member} sizes judged at {shape}, scaled to fit the host")
            scale_workers(run, sizes)
            live = {r.label for r in run.live()}
            try:
                parity_bench(run, init, at=shape)
            # other processes' memory, not the member's: no verdict, as at the benchmark's shape (a batch judges the
            # job again with the GPU to itself)
            except GpuMemoryShort:
                raise
            except UsageError as e:  # the reference raised on its own inputs there: not a shape it takes
                refused += _refused(run, entry, e, f"{shape} ({member} sizes)")
                continue
            wrong_at(run, live, bench, shape, member, rec["family"])
            entry["passed"] = sorted(r.label for r in run.live() if r.label in live)
        finally:
            g.update({k: old for k, (old, _) in sizes.items()})
            scale_workers(run, {k: (new, old) for k, (old, new) in sizes.items()})
            run._fp = bench_fp
            drop_input_buffers(run)
    run.refs = bench_refs
    skipped = [f"{e['member']} ({_short(e['skipped'])})" for e in rec["family"] if e.get("skipped")]
    if skipped:  # the verdict line says it too: an acceptance under --shapes is only as wide as what was judged
        judged_n = sum(1 for e in rec["family"] if e.get("passed") is not None)
        run.notes.append(
            f"--shapes: {judged_n} other shape{'s' * (judged_n != 1)} judged; not judged at {', '.join(skipped)}"
        )


def _refused(run, entry: dict, e: UsageError, where: str) -> int:
    """A member where the reference itself raises (on its own inputs, in the judge's mode): not a shape it takes
    (a channel count its layers fix, an image size its patches assume, a BatchNorm training on a batch of one).
    Skipped and said, in the record too; 1, a member that does not count towards --shapes N."""
    broken = cuda_broken() if run.device == "cuda" else None
    if broken:  # its fault was a sticky one: nothing more can run on this process's GPU
        raise UsageError(
            f"at {where} the reference raised a CUDA error that leaves the judge's GPU context "
            f"unusable ({broken}): a shape it does not take; name the members it takes "
            f"(--shapes odd,half, ...)"
        ) from None
    why = e.cause if isinstance(e, ReferenceRaised) else str(e)  # the exception's own words
    entry["skipped"] = f"the reference raises there ({why})"
    run.skip(f"at {where}: the reference raises there ({why[:160]})")
    return 1


def scale_workers(run, sizes: dict) -> None:
    """The family's sizes ({name: (now, there)}) set in every worker that still judges a row or times the
    baselines alone (the worker's scale command: the candidate's own copies of them, and the worker's reference,
    which draws the timing's inputs); a worker that cannot take them rejects its rows."""
    for runner in run.runners:
        rows = [r for r in run.rows if r.runner is runner]
        if rows and not any(r.accepted for r in rows):
            continue
        try:
            runner.call("scale", "scale", sizes)
        except Rejected as e:
            for r in rows:
                r.reject(e)


def right_at(family: list, label: str) -> list[tuple[str, str]]:
    """The members (shape, name) the family's checks so far passed the row at, in the order judged."""
    return [(e["shape"], e["member"]) for e in family if label in e.get("passed", ())]


def wrong_at(run, live: set[str], bench: str, shape: str, member: str, family: list) -> None:
    """The rows live before a member's checks (`live`) and rejected by them: their reason names the shape it failed
    at and every shape it was right at before (the benchmark's, then the members that passed it: a row right at
    several is not one right at the benchmark's shape alone)."""
    for row in run.rows:
        if row.label in live and not row.accepted:
            why = row.reason.removeprefix(f"at {shape}: ")
            right = [(s, m) for s, m in right_at(family, row.label) if s != shape]
            said = [bench, *(f"{s} ({m})" for s, m in right)]
            where = f"{bench} only" if not right else f"{', '.join(said[:-1])} and {said[-1]}"
            row.reason = f"shapes: right at {where}, wrong at {shape} ({member} sizes): {why}"
            if row.failure is not None:
                row.failure["member"] = {"name": member, "shape": shape, "right_at": [bench, *(s for s, _ in right)]}


def no_room_for(
    fp: dict, bench_fp: dict, device: str, f64_device: str, rows: int, backward: bool = False
) -> str | None:
    """Why a member's shape (footprint fp) is not judged here, or None: the CPU's host budget as for the benchmark's
    shape (bench_fp); on a GPU, a member larger than the benchmark's must fit in what is free now, beside the plan's
    need for `rows` judged rows and the float64 reference's peak (its backward's with `backward`) where it runs on
    the GPU (f64_device)."""
    if device != "cuda" or f64_device == "cpu":  # the float64 reference on the host: its room there
        why = cpu_bench_refusal(fp, host_budget(), "it", backward)
        if why or device != "cuda":
            return why

    def need(at: dict) -> int:  # the plan's, with the float64 reference's peak where it runs on the GPU
        return memory_need(at, rows) + (float64_peak(at, backward) if f64_device == "cuda" else 0)

    grow, free = need(fp) - need(bench_fp), free_gpu_bytes()
    if grow > 0.8 * free:
        return (
            f"it needs {grow / 2**30:.1f} GiB of GPU memory more than the benchmark's shape, "
            f"{free / 2**30:.1f} GiB are free"
        )
    return None


def _short(why: str) -> str:
    """A skip's reason in a few words for the verdict line (the record keeps it whole)."""
    head = why.split(" (", 1)[0].split(": ", 1)[0]
    return head if len(head) <= 60 else head[:57] + "..."
