"""The judge's construct stage and what comes before it: the memory plan, the baselines (or the reference run once) in
every worker, each candidate's import, and each row's model built after the reference's seed with the reference's
state loaded as far as it maps. Functions of the judge's run (kp.judge.driver.Judge)."""

from __future__ import annotations

from pathlib import Path


from kp.errors import NoVerdict, OutOfMemory, Rejected, UsageError
from kp.judge.expected import Row, _Refs, _unread_counter
from kp.judge.float64 import float64_copy
from kp.worker.languages import gpu_languages
from kp.judge.plan import check_memory, float64_chunks, float64_on_gpu, gpu_snapshot, held_by_others
from kp.judge.reference import partial_map, state_map, unmapped
from kp.lib.numerics import cpu_kernels


def build_row(
    run, row: Row, refs: _Refs, init, seed: int, stage: str = "construct", state=None, load: bool = True
) -> None:
    """Construct the row's model after the seed and load the reference's state (its state now, or `state`) as
    far as it maps: whole (kp.judge.reference.state_map: by name, in order, or by name and shape), else
    KernelBench's same-seed contract (what has the same name and shape is loaded, the rest keeps the
    candidate's own same-seed initialisation, and only what maps is changed between calls)."""
    reply = row.runner.call(stage, "build", row.label, init, seed)
    keys = [(k, tuple(s)) for k, s in reply["keys"]]
    if run.train and reply.get("eval_modules"):
        kinds = reply["eval_modules"]
        what = "BatchNorm would use running statistics" if any("Norm" in k for k in kinds) else "Dropout would be off"
        raise Rejected(
            f"{stage}: ModelNew is in eval mode (self.training is False) but the reference trains: "
            f"{what} ({', '.join(kinds)}); --mode eval judges inference semantics",
            kind="construct",
        )
    ref_keys = refs.keys()
    names = state_map(ref_keys, keys) if ref_keys else {}
    if names is None:  # in order again without the counters nothing reads (a rewrite need not keep them)
        names = state_map([(k, s) for k, s in ref_keys if not _unread_counter(refs.r32, k)], keys)
    renamed = {k: v for k, v in (names or {}).items() if k != v}
    if renamed and row.weights is None:  # loaded whole under other names: the mapping said, so a wrong one is seen
        pairs = ", ".join(f"{k} -> {v}" for k, v in list(renamed.items())[:4])
        more = f" (+{len(renamed) - 4} more)" if len(renamed) > 4 else ""
        row.weights = f"the reference's loaded whole under other names: {pairs}{more}"
        run.log(f"{run.ref.name}: {row.label} weights: {row.weights}")
    if names is None:
        names = partial_map(ref_keys, keys)
        if row.weights is None:
            params = {k for k, _ in refs.r32.named_parameters()}
            moved = sorted(k for k in names if k in params)
            left = unmapped(ref_keys, keys, names)
            row.weights = (
                "same-seed init; "
                + (
                    f"loaded and changed between calls: {len(moved)} of {len(params)} parameters by name"
                    if moved
                    else "not changed between calls: no parameter maps"
                )
                + (f" ({left})" if left else "")
            )
            run.log(f"{run.ref.name}: {row.label} weights: {row.weights}")
    row.names = names
    if names and load:
        state = {names[k]: v for k, v in (refs.state() if state is None else state).items() if k in names}
        loaded = row.runner.call(stage, "load_weights", row.label, state)
        if not loaded.get("loaded"):  # the judge's loading, not the candidate's code, met what the module refuses
            row.runner.call(stage, "build", row.label, init, seed)  # as built: nothing half loaded
            row.names = {}
            row.weights = (
                f"same-seed init: the reference's weights could not be loaded into it "
                f"({str(loaded.get('why'))[:120]}); not changed between calls"
            )
            run.log(f"{run.ref.name}: {row.label} weights: {row.weights}")


def fresh_refs(run, init) -> _Refs:
    """The references as built after the seed, holding the current weights and buffers: where calls carry
    state, both they and the rows start again from here."""
    old = run.refs
    new = _Refs(run.ref, init, run.seed, run.device, old.f64_device, run.train, chunks=old.chunks)
    new.r32.load_state_dict(old.state())
    new.r64 = float64_copy(new.r32, new.f64_device)
    new.how, new.moved, new.chunk_proof, new.state_attrs = old.how, old.moved, old.chunk_proof, old.state_attrs
    new._state_calls = old._state_calls
    new.initial = old.initial
    new.bench_rms = old.bench_rms  # at a member of the family: its few outputs' floor (Expected.of)
    return new


def cuda_builds_on_cpu(run) -> None:
    """On the CPU, a row turned away after its extension's CUDA build failed was turned away by the host, not
    for a defect of its own: this host cannot build or run CUDA code (torch without CUDA, no toolkit). No
    verdict then, and where to judge it."""
    if run.device != "cpu":
        return
    for row in run.rows:
        langs = gpu_languages(row.path) if getattr(row, "path", None) and not row.accepted and not row.peer else []
        if langs:  # its kernels cannot run on this host (their compiler is often not even installed here)
            raise NoVerdict(
                f"{run.ref.name}: no verdict on the CPU: {row.label} writes its kernels in "
                f"{' and '.join(langs)}, a GPU kernel language, which this host cannot run "
                f"({row.reason[:120] if row.reason else 'rejected'}); judge it on a GPU"
            )
        if not row.accepted and not row.peer and (row.failure or {}).get("needs") == "cuda":
            raise NoVerdict(
                f"{run.ref.name}: no verdict on the CPU: {row.label} asks for CUDA, which this host "
                f"does not have ({row.reason[:160]}); judge it on a GPU"
            )
        failed = [f for f in getattr(row.runner, "build_failures", None) or [] if f.get("cuda")]
        if failed and not row.accepted and not row.peer:
            raise NoVerdict(
                f"{run.ref.name}: no verdict on the CPU: {row.label}'s extension "
                f"{failed[0]['extension']!r} compiles CUDA code, which this host cannot build or run "
                f"({failed[0]['error'][:160]}); judge it on a GPU"
            )


def stage_setup(run, rec: dict, init) -> None:
    _setup(run, init, run.device == "cuda")
    rec["float64_reference"] = run.f64_where


def stage_import(run, rec: dict, init) -> None:
    _import_rows(run)


def _setup(run, init, gpu: bool) -> None:
    """The memory plan, then every worker made ready (_ready_worker): the eager and torch.compile baselines in
    it where the run is timed, else the reference run once in each candidate's worker."""
    if gpu:
        run.gpu_at_plan = gpu_snapshot()
        run.others_at_plan = held_by_others(run.gpu_at_plan)
        free = run.gpu_at_plan[0]
        check_memory(run.ref.name, run.fp, len(run.rows), free)
        on_gpu, why = float64_on_gpu(run.fp, len(run.rows), free, run.backward)
        run.f64_chunks = 0 if on_gpu else float64_chunks(run.fp, len(run.rows), free)
        run.f64_device = run.device if on_gpu or run.f64_chunks else "cpu"
        run.f64_where = (
            f"{'the GPU' if on_gpu else 'the host'} ({why})"
            if not run.f64_chunks
            else f"the GPU in {run.f64_chunks} slices of the batch where it can be sliced, else the host ({why})"
        )
        run.log(f"{run.ref.name}: the float64 reference runs on {run.f64_where}")
    if gpu and run.bench:  # the baselines hold the reference's weights as built after the seed
        run.log(f"{run.ref.name}: building the eager{' and torch.compile' if run.compile_baseline else ''} baselines")
        state = run.ref.model(init, run.seed, run.device, run.train).state_dict()
        run.baseline_args = (init, run.seed, state, run.compile_baseline, run.seed)
    elif gpu:
        run.prime_args = (init, run.seed, run.seed)
    for runner in run.runners:
        ready_worker(run, runner)


def ready_worker(run, runner) -> None:
    """A worker made ready for the candidate before its file is imported: the timing stage's baselines built and
    run once in it, or without timing the reference run once and dropped (the worker's prime command), now or, in a
    batch's box started ahead, before the job came (kp.batch.prime): either way the reference has run in the
    candidate's process first, as in a user's."""
    try:
        if run.at_sizes:  # --at: the worker's reference draws at the shape judged from its first call
            runner.call("scale", "scale", run.at_sizes)
        if run.baseline_args:
            with run.clock.timed("setup: the baselines built and run once"):
                runner.call("baselines", "baselines", *run.baseline_args)
        elif run.prime_args and runner.isolated:
            # run in its box while the slot's job before it judged (at the benchmark's shape: not with --at)
            ahead = None if run.at_sizes else getattr(runner, "ran_ahead", None)
            r = ahead(run.prime_args) if ahead else None
            if r is None:  # made on the host, in its box
                made = not run.at_sizes and getattr(runner, "made_ahead", lambda _: False)(run.prime_args)
                with run.clock.timed("setup: the reference run once in the candidate's process"):
                    r = runner.call("prime", "prime", *run.prime_args, made)
            else:
                run.clock.tally("setup: the reference run once in the candidate's process, ahead of the job", 0.0)
            note = (
                f"the reference could not run in the candidate's process before it ({r.get('why')}): a "
                f"library the candidate's first call uses may be set up inside that call"
            )
            if not r.get("primed") and note not in run.notes:
                run.notes.append(note)
    except OutOfMemory:
        raise
    # only the reference's code has run there yet (its device-side assert, say): no row is to blame, and no verdict
    # can follow
    except Rejected as e:
        raise UsageError(
            f"the reference, run once in the candidate's process before the candidate's file was "
            f"imported, failed there: {e}"
        ) from None


def _import_rows(run) -> None:
    for row in run.rows:
        if row.runner.isolated:
            try:
                with run.clock.timed("import: the candidate's worker ready and its file imported"):
                    r = row.runner.call("import", "load", str(Path(row.path).resolve()))
                mine = cpu_kernels()
                if r.get("cpu") and r["cpu"][0] != mine[0] and row.respawn is not None:
                    # one PyTorch, two choices of its CPU kernels (a box started before this process imported
                    # torch chose its own): a fresh worker is told this process's choice
                    row.runner.close()
                    run.runners.remove(row.runner)
                    row.runner = row.respawn()
                    ready_worker(run, row.runner)
                    r = row.runner.call("import", "load", str(Path(row.path).resolve()))
                if r.get("cpu") not in (None, mine):  # still, or threads alone: said beside the verdict
                    said = "{} CPU kernels on {} threads".format
                    run.notes.append(
                        f"the candidate's process runs PyTorch's {said(*r['cpu'])}, the judge's "
                        f"its {said(*mine)}: PyTorch's own operators may round differently there"
                    )
                if not r["has_model_new"]:
                    row.reject(Rejected("import: the file defines no class ModelNew", kind="import"))
                elif run.at_sizes:  # --at: the candidate's own copies of the sizes, as at any member
                    row.runner.call("scale", "scale", run.at_sizes)
            except Rejected as e:
                row.reject(e)
