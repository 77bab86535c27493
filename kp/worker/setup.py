"""The worker's setup commands: the timing's baselines, the reference run once before the candidate's import, the
candidate's file imported (and, ahead of judging, its builds started), a model built, its weights changed or dropped,
the sizes of another shape taken. A part of kp.worker.loop.Worker over the worker's one state
(kp.worker.state.WorkerState)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path

import torch

from kp.box.start import needs_dynamo
from kp.judge.family import same_value
from kp.judge.float64 import _convert, hold_on
from kp.judge.reference import apply_update, load_state
from kp.lib.layers import set_precision
from kp.lib.numerics import cpu_kernels
from kp.lib.timing import L2Flusher
from kp.observe.profile import profiler
from kp.worker.guards import (
    loaded_objects,
    namespace_fingerprint,
    record_build_failures,
    settle_torch,
    train_sensitive,
    watch_thread_starts,
)
from kp.worker.languages import watch_jit_builds
from kp.worker.replies import error_text

# a build ahead of judging yields the cores to the judges beside it (their host clocks, their timed calls): it is
# throughput, they are latency; it still gets every core they leave idle
BUILD_AHEAD_NICE = 10

_WARM: set[str] = set()  # what warm_up has done in this process
# shapes the torch.compile baseline compiles for, each statically (the benchmark's, the family's)
COMPILED_SHAPES = 64


def warm_up(device: str, dynamo: bool = True) -> None:
    """Everything the judge's own stages import or initialise, done before the candidate's file is imported (and
    before the snapshot its changes are found against): on the GPU, CUDA's context, the L2 flush's buffer and the
    profiler's first use; torch._dynamo and torch.compile's first-use patches only where the candidate may compile
    (`dynamo`, kp.box.start.needs_dynamo). Once per process: a box started ahead of its job does it while it waits."""
    if dynamo and "dynamo" not in _WARM:
        # torch wraps SGD.step on first use (and its __init__ imports torch._dynamo)
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        importlib.import_module("torch._dynamo")
        _WARM.add("dynamo")
    if device == "cuda" and device not in _WARM:
        torch.zeros(1, device="cuda")
        L2Flusher()
        e = torch.cuda.Event(enable_timing=True)
        with profiler():
            e.record()
            torch.cuda._sleep(10)
            torch.cuda.synchronize()
        _WARM.add(device)


class SetupCommands:
    """Worker commands that set up what the other commands run; see the module doc."""

    def __init__(self, state):
        self.state = state

    def cmd_baselines(self, init, seed, state, compile_baseline: bool, example_seed: int):
        """Eager and torch.compile references for the timing table, built and run once before any judged model
        exists (the fingerprint is taken after their first calls, so their own lazy setup is not a change)."""
        st = self.state
        eager = st.ref.model(init, seed, st.device, st.train)
        eager.load_state_dict(state)
        st.baselines = {"eager": eager}
        # shares eager's weights: one copy of them on the device. Static at every shape it is timed at (--shapes times
        # several), as a user compiling for that shape gets it; by default dynamo would go dynamic at the second shape
        # and, past its recompile limit, fall back to eager without a word
        if compile_baseline:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_SHAPES)
            st.baselines["torch.compile"] = torch.compile(eager, dynamic=False)
        x = st.ref.inputs(example_seed, st.device)
        set_precision(st.precision)
        with torch.no_grad():
            for m in st.baselines.values():
                m(*x)
        torch.cuda.synchronize()
        return {}

    def cmd_ready(self):
        """Nothing: its answer says the worker is up and serving (a slot's run of the reference ahead of the job,
        kp.batch.prime, waits for it before it takes the GPU's gate)."""
        return {}

    def cmd_prime_build(self, init, seed: int, example_seed: int):
        """cmd_prime's model and inputs made on the host and kept: a run ahead of the job (kp.batch.prime) does the
        host's part before it takes the GPU's gate, and holds the gate only while they are moved and called."""
        st = self.state
        st.prime_built = None
        try:
            st.prime_built = (st.ref.model(init, seed, "cpu", st.train), st.ref.inputs(example_seed, "cpu"))
            return {"built": True}
        except Exception as e:  # cmd_prime makes them on the device instead
            return {"built": False, "why": error_text(e)}

    def cmd_prime(self, init, seed: int, example_seed: int, built: bool = False):
        """The reference's Model built and called once on benchmark inputs, then dropped, before the candidate's file
        is imported: the process is then in the state a user's is in when it calls a candidate after its reference
        (cuBLAS's and cuDNN's handles and workspaces made, the kernels' modules loaded), which a candidate that
        captures a CUDA graph at its first call relies on (a library's first use inside a capture fails). Only the
        reference's code runs. The timing stage's baselines (cmd_baselines) do the same and stay. built: the model
        and inputs cmd_prime_build made are moved to the device (else made there). Returns whether it ran, and why
        not where it did not."""
        st = self.state
        ahead, st.prime_built = st.prime_built, None
        try:
            if built and ahead is not None:
                m, x = hold_on(ahead[0], st.device, st.ref.dtype), _convert(ahead[1], st.device, None)
            else:
                with torch.device(st.device):  # the values do not matter: made where they run, not copied there
                    m = st.ref.model(init, seed, st.device, st.train)
                    x = st.ref.inputs(example_seed, st.device)
            ahead = None
            set_precision(st.precision)
            with torch.no_grad():
                m(*x)
            if st.device == "cuda":
                torch.cuda.synchronize()
            return {"primed": True}
        except Exception as e:  # the judge's own run of the reference reports a broken reference; here: said
            return {"primed": False, "why": error_text(e)}
        finally:
            m = x = None
            if st.device == "cuda":
                torch.cuda.empty_cache()

    def cmd_load(self, path: str):
        st = self.state
        dynamo = needs_dynamo(path)
        warm_up(st.device, dynamo)
        if dynamo:
            settle_torch()
        record_build_failures(st.build_failures, st.build_seconds)
        watch_jit_builds(path, st.build_seconds)  # Triton's compile and autotuning: build time, not the call's
        cpu = cpu_kernels()  # before the candidate's code runs: what torch here picked, for the judge to compare
        p = Path(path).resolve()
        watch_thread_starts(str(p.parent))
        st.fingerprint = namespace_fingerprint()
        st.objects_before = loaded_objects()
        st.threads_before = {t.ident for t in threading.enumerate()}
        st.candidate_dir = str(p.parent)
        return {"has_model_new": self._import(p), "cpu": cpu}

    def _import(self, p: Path) -> bool:
        """The candidate's file imported as `kp_candidate`; whether it has a ModelNew class (the factory then)."""
        sys.path.insert(0, str(p.parent))
        spec = importlib.util.spec_from_file_location("kp_candidate", p)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kp_candidate"] = module
        spec.loader.exec_module(module)
        if not isinstance(getattr(module, "ModelNew", None), type):
            return False
        self.state.factories["candidate"] = module.ModelNew
        return True

    def cmd_prebuild(self, path: str):
        """Ahead of judging (kp.batch.ahead): the candidate's file imported, then, for an extension built later
        than its import (in __init__ or at the first call), ModelNew built and called on the meta device, where
        nothing is allocated or computed and a call that needs real data fails at once, after the build it starts.
        Whatever the candidate's code raises here is ignored: its judging runs it again and says. Returns the
        seconds spent in its load/load_inline calls."""
        st = self.state
        try:  # this worker's compilers inherit it (the worker runs nothing else: it ends after this command)
            os.nice(BUILD_AHEAD_NICE)
        except OSError:
            pass
        record_build_failures(st.build_failures, st.build_seconds)
        if self._import(Path(path).resolve()):
            steps = (
                lambda: st.factories["candidate"](*st.ref.init()),
                lambda: st.models["ahead"](*st.ref.module.get_inputs()),
            )
            for step in steps:
                try:
                    with torch.device("meta"), torch.no_grad():
                        st.models["ahead"] = step()
                except BaseException:  # noqa: B036 - sys.exit() in a candidate's call ends nothing here
                    break
            st.models.pop("ahead", None)
        return {"build_s": st.build_seconds[0]}

    def cmd_build(self, label: str, init, seed: int, source: str | None = None, train: bool | None = None):
        """The model `label` from the factory `source` (default: the same name) after the seed; in eval mode when
        the judge asks for inference semantics. Returns its state_dict keys and the train-sensitive modules
        (BatchNorm, Dropout) it has in eval mode."""
        st = self.state
        st.models.pop(label, None)
        torch.manual_seed(seed)
        m = st.factories[source or label](*init)
        is_module = isinstance(m, torch.nn.Module)
        if is_module:  # in fp16 and bf16 cast as the reference is (Reference.model), plain tensor attributes too
            m = m.to(st.device) if st.ref.dtype is None else hold_on(m, st.device, st.ref.dtype)
            if not (st.train if train is None else train):
                m.eval()
        st.models[label] = m
        keys = [(k, tuple(v.shape)) for k, v in m.state_dict().items()] if is_module else []
        frozen = train_sensitive(m) if is_module and not all(x.training for x in m.modules()) else []
        return {"keys": keys, "eval_modules": frozen}

    def cmd_update(self, label: str, update: dict):
        apply_update(self.state.models[label], update)
        return {}

    def cmd_load_weights(self, label: str, state: dict):
        """The reference's weights loaded into a freshly built model (the judge's mapping of its keys): whether the
        module took them, and why not where torch's load_state_dict refused them (a shape the mapping cannot see,
        a module that keeps no such tensor); whatever else the candidate's code raises is its own."""
        try:
            load_state(self.state.models[label], state)
        except RuntimeError as e:
            if "loading state_dict" not in str(e):  # torch's own refusal, told apart from the candidate's raise
                raise
            return {"loaded": False, "why": error_text(e)}
        return {"loaded": True}

    def cmd_drop(self, label: str):
        self.state.models.pop(label, None)
        return {}

    def cmd_scale(self, sizes: dict):
        """The judge checks another shape of the reference's family (the CPU's room, --shapes): the same module-level
        sizes of the candidate's file, where it has them with the benchmark's values, take the new ones too, so a
        ModelNew written against the file's own sizes meets the shapes it is given; this process's reference, which
        draws the timing's inputs, takes them all."""
        module = sys.modules.get("kp_candidate")
        changed = []
        for name, (old, new) in sizes.items():  # a size, or a global the file computes from sizes (a tuple)
            if module is not None and same_value(getattr(module, name, None), old):
                setattr(module, name, new)
                changed.append(name)
            ref = vars(self.state.ref.module)  # this process's reference draws the timing's inputs: at the same sizes
            if same_value(ref.get(name), old):  # (a module shared with the judge: set already)
                ref[name] = new
        return {"changed": changed}
