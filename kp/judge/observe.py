"""The judge's optional observation stages: one call of each row under PyTorch's profiler (--profile) and under
Nsight Compute (--ncu)."""
from __future__ import annotations

from pathlib import Path

from kp.errors import Rejected
from kp.judge.outputs import _release


class ObserveStage:
    """Methods of kp.judge.driver.Judge: the stage's state is the judge's."""

    def stage_profile(self, rec: dict, init) -> None:
        rec["profile"] = self._profile()

    def stage_ncu(self, rec: dict, init) -> None:
        rec["ncu"] = self._ncu(init, rec)

    def _profile(self) -> dict:
        """One call of each baseline and live row under the profiler, in the process that holds it (a candidate's
        own worker); a failure here is logged, never a verdict."""
        out = {}
        for runner in self.runners:
            rows = [r for r in self.live() if r.runner is runner]
            if self.rows and not rows:
                continue
            try:
                out.update(runner.call("profile", "profile", [r.label for r in rows],
                                       (self.seed + 3000) % 2**32)["profile"])
            except Rejected as e:
                self.log(f"{self.ref.name}: no profile: {e}")
        return out

    def _ncu(self, init, rec: dict) -> dict:
        """One call of each baseline and live row under Nsight Compute (kp.observe.ncu), in a process of its own started
        after the judge's rows are released; a boxed candidate is left out (kp.observe.ncu says why)."""
        from kp.observe import ncu
        from kp.observe.report import row_traffic
        rows, notes = [], []
        for r in self.live():
            if r.runner.isolated:
                if r.runner.sandboxed:
                    notes.append(f"{r.label} not profiled: it runs in the sandbox, which ncu cannot reach into "
                                 f"(--no-sandbox includes it)")
                    continue
                rows.append({"label": r.label, "candidate": str(Path(r.path).resolve())})
            else:
                rows.append({"label": r.label, "variant": r.variant, "opts": r.opts})
        min_bytes = {k: row_traffic(rec, k)["bytes"] for k in ["eager", "torch.compile"] + [r["label"] for r in rows]
                     } if rec.get("traffic") else {}
        spec = {"ref_spec": list(self.ref.spec), "precision": self.precision, "init": init, "seed": self.seed,
                "compile": self.compile_baseline, "rows": rows, "notes": notes}
        self.log(f"{self.ref.name}: one call of each row under Nsight Compute")
        _release()
        return ncu.run(spec, min_bytes, rec.get("bandwidth"))
