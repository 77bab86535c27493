"""The judge's construct stage and what comes before it: the memory plan, the baselines (or the reference run once) in
every worker, each candidate's import, and each row's model built after the reference's seed with the reference's
state loaded as far as it maps (methods of kp.judge.driver.Judge)."""
from __future__ import annotations

from pathlib import Path

import torch

from kp.errors import NoVerdict, OutOfMemory, Rejected, UsageError
from kp.judge.expected import Row, _Refs, _unread_counter
from kp.judge.outputs import Expected
from kp.judge.float64 import float64_copy
from kp.worker.languages import gpu_languages
from kp.judge.plan import check_memory, float64_chunks, float64_on_gpu, gpu_snapshot, held_by_others
from kp.judge.reference import partial_map, state_map, unmapped
from kp.lib.numerics import cpu_kernels


class ConstructStage:
    """Construct: each row's model built after the reference's seed with the reference's state loaded as far as it
    maps (methods of kp.judge.driver.Judge)."""

    def _build(self, row: Row, refs: _Refs, init, seed: int, stage: str = "construct", state=None,
               load: bool = True) -> None:
        """Construct the row's model after the seed and load the reference's state (its state now, or `state`) as
        far as it maps: whole (by name, or in order where the names differ but the shapes line up), else
        KernelBench's same-seed contract (what has the same name and shape is loaded, the rest keeps the
        candidate's own same-seed initialisation, and only what maps is changed between calls)."""
        reply = row.runner.call(stage, "build", row.label, init, seed)
        keys = [(k, tuple(s)) for k, s in reply["keys"]]
        if self.train and reply.get("eval_modules"):
            kinds = reply["eval_modules"]
            what = "BatchNorm would use running statistics" if any("Norm" in k for k in kinds) else \
                "Dropout would be off"
            raise Rejected(f"{stage}: ModelNew is in eval mode (self.training is False) but the reference trains: "
                           f"{what} ({', '.join(kinds)}); --mode eval judges inference semantics", kind="construct")
        ref_keys = refs.keys()
        names = state_map(ref_keys, keys) if ref_keys else {}
        if names is None:  # in order again without the counters nothing reads (a rewrite need not keep them)
            names = state_map([(k, s) for k, s in ref_keys if not _unread_counter(refs.r32, k)], keys)
        if names is None:
            names = partial_map(ref_keys, keys)
            if row.weights is None:
                params = {k for k, _ in refs.r32.named_parameters()}
                moved = sorted(k for k in names if k in params)
                left = unmapped(ref_keys, keys, names)
                row.weights = ("same-seed init; " + (f"loaded and changed between calls: {len(moved)} of "
                                                     f"{len(params)} parameters by name" if moved else
                                                     "not changed between calls: no parameter maps")
                               + (f" ({left})" if left else ""))
                self.log(f"{self.ref.name}: {row.label} weights: {row.weights}")
        row.names = names
        if names and load:
            state = {names[k]: v for k, v in (refs.state() if state is None else state).items() if k in names}
            try:
                row.runner.call(stage, "update", row.label, {"kind": "load_state_dict", "state": state})
            except Rejected as e:  # the judge's loading, not the candidate's code, met what the module refuses
                if "loading state_dict" not in str(e):
                    raise
                row.runner.call(stage, "build", row.label, init, seed)  # as built: nothing half loaded
                row.names = {}
                row.weights = (f"same-seed init: the reference's weights could not be loaded into it "
                               f"({str(e).split('raised ', 1)[-1][:120]}); not changed between calls")
                self.log(f"{self.ref.name}: {row.label} weights: {row.weights}")

    def _fresh_refs(self, init) -> _Refs:
        """The references as built after the seed, holding the current weights and buffers: where calls carry
        state, both they and the rows start again from here."""
        old = self.refs
        new = _Refs(self.ref, init, self.seed, self.device, old.f64_device, self.train, chunks=old.chunks)
        new.r32.load_state_dict(old.state())
        new.r64 = float64_copy(new.r32, new.f64_device)
        new.how, new.moved, new.chunk_proof, new.state_attrs = old.how, old.moved, old.chunk_proof, old.state_attrs
        new._state_calls = old._state_calls
        new.initial = old.initial
        new.bench_rms = old.bench_rms  # at a member of the family: its few outputs' floor (Expected.of)
        return new

    def _own_init(self, row: Row, init, label: str, pristine: list, exp: Expected) -> str | None:
        """A row wrong with the reference's weights loaded, judged once more at its own same-seed initialisation
        (nothing loaded): when that passes, why it failed is that its parameters mean something else."""
        try:
            row.runner.call(label, "build", row.label, init, self.seed)
            self._check_call(row, label, pristine, exp)
        except Rejected:
            return None
        how = "by name" if all(k == v for k, v in row.names.items()) else "in order"
        return (f"right at its own same-seed initialisation, wrong with the reference's weights loaded {how}: its "
                f"parameters mean something else (e.g. pre-scaled, transposed or folded)")

    def _eval_semantics(self, row: Row, init, label: str, pristine: list) -> str | None:
        """A training-mode row wrong at its first call, judged once more against the reference in eval mode (a fresh
        one, as built): when that passes, the candidate normalises with running statistics where a training Model
        uses the batch's, the defect of BatchNorm folded or fused for inference, and the reason says so. Only the
        first call comes here, before any weight change: the reference's state as built is its state now with the
        buffers that call moved put back."""
        if not (self.train and any(isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
                                   for m in self.refs.r32.modules())):
            return None
        try:
            exp = _Refs(self.ref, init, self.seed, self.device, self.refs.f64_device, train=False).expected(
                pristine, self.precision)
            as_built = {**self.refs.state(), **self.refs.initial}
            self._build(row, self.refs, init, self.seed, stage=label, state=as_built)
            self._check_call(row, label, pristine, exp)
        except Rejected:
            return None
        return ("it matches the reference in eval mode: it normalises with BatchNorm's running statistics where a "
                "training-mode Model uses the batch's (--mode eval judges inference semantics)")

    def _cuda_builds_on_cpu(self) -> None:
        """On the CPU, a row turned away after its extension's CUDA build failed was turned away by the host, not
        for a defect of its own: this host cannot build or run CUDA code (torch without CUDA, no toolkit). No
        verdict then, and where to judge it."""
        if self.device != "cpu":
            return
        for row in self.rows:
            langs = gpu_languages(row.path) if getattr(row, "path", None) and not row.accepted and not row.peer \
                else []
            if langs:  # its kernels cannot run on this host (their compiler is often not even installed here)
                raise NoVerdict(f"{self.ref.name}: no verdict on the CPU: {row.label} writes its kernels in "
                                f"{' and '.join(langs)}, a GPU kernel language, which this host cannot run "
                                f"({row.reason[:120] if row.reason else 'rejected'}); judge it on a GPU")
            if not row.accepted and not row.peer and (row.failure or {}).get("needs") == "cuda":
                raise NoVerdict(f"{self.ref.name}: no verdict on the CPU: {row.label} asks for CUDA, which this host "
                                f"does not have ({row.reason[:160]}); judge it on a GPU")
            failed = [f for f in getattr(row.runner, "build_failures", None) or [] if f.get("cuda")]
            if failed and not row.accepted and not row.peer:
                raise NoVerdict(f"{self.ref.name}: no verdict on the CPU: {row.label}'s extension "
                                f"{failed[0]['extension']!r} compiles CUDA code, which this host cannot build or run "
                                f"({failed[0]['error'][:160]}); judge it on a GPU")

    def stage_setup(self, rec: dict, init) -> None:
        self._setup(init, self.device == "cuda")
        rec["float64_reference"] = self.f64_where

    def stage_import(self, rec: dict, init) -> None:
        self._import_rows()

    def _setup(self, init, gpu: bool) -> None:
        """The memory plan, then every worker made ready (_ready_worker): the eager and torch.compile baselines in
        it where the run is timed, else the reference run once in each candidate's worker."""
        if gpu:
            self.gpu_at_plan = gpu_snapshot()
            self.others_at_plan = held_by_others(self.gpu_at_plan)
            free = self.gpu_at_plan[0]
            check_memory(self.ref.name, self.fp, len(self.rows), free)
            on_gpu, why = float64_on_gpu(self.fp, len(self.rows), free)
            self.f64_chunks = 0 if on_gpu else float64_chunks(self.fp, len(self.rows), free)
            self.f64_device = self.device if on_gpu or self.f64_chunks else "cpu"
            self.f64_where = f"{'the GPU' if on_gpu else 'the host'} ({why})" if not self.f64_chunks else \
                f"the GPU in {self.f64_chunks} slices of the batch where it can be sliced, else the host ({why})"
            self.log(f"{self.ref.name}: the float64 reference runs on {self.f64_where}")
        if gpu and self.bench:  # the baselines hold the reference's weights as built after the seed
            self.log(f"{self.ref.name}: building the eager{' and torch.compile' if self.compile_baseline else ''}"
                     f" baselines")
            state = self.ref.model(init, self.seed, self.device, self.train).state_dict()
            self.baseline_args = (init, self.seed, state, self.compile_baseline, self.seed)
        elif gpu:
            self.prime_args = (init, self.seed, self.seed)
        for runner in self.runners:
            self._ready_worker(runner)

    def _ready_worker(self, runner) -> None:
        """A worker made ready for the candidate before its file is imported: the timing stage's baselines built and
        run once in it, or without timing the reference run once and dropped (the worker's prime command), now or, in a
        batch's box started ahead, before the job came (kp.batch.prime): either way the reference has run in the
        candidate's process first, as in a user's."""
        try:
            if self.at_sizes:  # --at: the worker's reference draws at the shape judged from its first call
                runner.call("scale", "scale", self.at_sizes)
            if self.baseline_args:
                with self.clock.timed("setup: the baselines built and run once"):
                    runner.call("baselines", "baselines", *self.baseline_args)
            elif self.prime_args and runner.isolated:
                # run in its box while the slot's job before it judged (at the benchmark's shape: not with --at)
                ahead = None if self.at_sizes else getattr(runner, "ran_ahead", None)
                r = ahead(self.prime_args) if ahead else None
                if r is None:  # made on the host, in its box
                    made = not self.at_sizes and getattr(runner, "made_ahead", lambda _: False)(self.prime_args)
                    with self.clock.timed("setup: the reference run once in the candidate's process"):
                        r = runner.call("prime", "prime", *self.prime_args, made)
                else:
                    self.clock.tally("setup: the reference run once in the candidate's process, ahead of the job", 0.0)
                note = (f"the reference could not run in the candidate's process before it ({r.get('why')}): a "
                        f"library the candidate's first call uses may be set up inside that call")
                if not r.get("primed") and note not in self.notes:
                    self.notes.append(note)
        except OutOfMemory:
            raise
        # only the reference's code has run there yet (its device-side assert, say): no row is to blame, and no verdict
        # can follow
        except Rejected as e:
            raise UsageError(f"the reference, run once in the candidate's process before the candidate's file was "
                             f"imported, failed there: {e}") from None

    def _import_rows(self) -> None:
        for row in self.rows:
            if row.runner.isolated:
                try:
                    with self.clock.timed("import: the candidate's worker ready and its file imported"):
                        r = row.runner.call("import", "load", str(Path(row.path).resolve()))
                    mine = cpu_kernels()
                    if r.get("cpu") and r["cpu"][0] != mine[0] and row.respawn is not None:
                        # one PyTorch, two choices of its CPU kernels (a box started before this process imported
                        # torch chose its own): a fresh worker is told this process's choice
                        row.runner.close()
                        self.runners.remove(row.runner)
                        row.runner = row.respawn()
                        self._ready_worker(row.runner)
                        r = row.runner.call("import", "load", str(Path(row.path).resolve()))
                    if r.get("cpu") not in (None, mine):  # still, or threads alone: said beside the verdict
                        said = "{} CPU kernels on {} threads".format
                        self.notes.append(f"the candidate's process runs PyTorch's {said(*r['cpu'])}, the judge's "
                                          f"its {said(*mine)}: PyTorch's own operators may round differently there")
                    if not r["has_model_new"]:
                        row.reject(Rejected("import: the file defines no class ModelNew", kind="import"))
                    elif self.at_sizes:  # --at: the candidate's own copies of the sizes, as at any member
                        row.runner.call("scale", "scale", self.at_sizes)
                except Rejected as e:
                    row.reject(e)
