"""The kernel playground's machinery behind harness.py (what models/ import) and run.py (the judge).

Its modules in layer order: a module imports only modules before it (tests/test_layers.py reads every import,
those inside functions too, and fails on one against this order, which also rules out an import circle).
"""

LAYER_ORDER = (
    # foundations: errors, numerics, the float64 copy, derived-input premises, the sandbox, the kernel registry
    "errors", "numerics", "float64", "premises", "sandbox", "registry",
    # building: a candidate's box paths, what a source exports and includes, the compile cache, the CPU-side compile
    # checks, the layers models/ are made of
    "boxstart", "sources", "build", "checks", "layers",
    # one judged call: the reference, timing, profiles, what is watched in a candidate's process, the worker that
    # runs a model, the boxed worker's entry
    "reference", "timing", "profile", "guards", "worker", "boxed",
    # reading and saying: Nsight Compute, the tables
    "ncu", "report",
    # the judge: its memory plan, what a call must return, its stages (construct and parity, escape and own kernel,
    # timing and ceilings, profiles), the driver that runs them in order; its roofline picture; many jobs (what a
    # job, a job file and a results file are; the slots and Ray tasks that judge them)
    "plan", "expected", "stage_parity", "stage_escape", "stage_timing", "stage_observe", "judge",
    "plot", "jobfile", "batch",
)
