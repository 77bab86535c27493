"""The kernel playground's machinery behind harness.py (what models/ import) and run.py (the judge), a folder per
concern: lib/ (the library models/ import), box/ (the sandbox), judge/ (the judge and its stages), observe/ (profiles,
counters, tables, pictures), batch/ (many jobs).

Its modules in layer order: a module imports only modules before it (tests/test_layers.py reads every import,
those inside functions too, and fails on one against this order, which also rules out an import circle). The
concerns interleave where one needs a low piece of another: the build keeps its cache where the box can mount it,
and the worker reads the profiler's events.
"""

import os

# torch's host allocations of 2 MiB and more on transparent huge pages (read once, at torch's first allocation in a
# process: set here, before any of the judge's processes imports torch, and inherited by those it starts). The
# judge draws, copies and compares outputs of gigabytes on the CPU call after call, each a fresh allocation; in
# 4 KiB pages their first touch was half of a CPU judgement's time (a 2-core host: 1.6 GB input, its float64 copy,
# softmax and clone, 6.0 s a call, 9.4 M page faults; 2.5-3.0 s, 27 k faults, on huge pages). THP_MEM_ALLOC_ENABLE=0
# turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


LAYER_ORDER = (
    # foundations: errors, numerics, a speedup's paired interval, the dispatch modes a reference is counted under, the
    # float64 copy, derived-input premises, the sandbox, the kernel registry, CUDA's driver started beside torch's
    # import
    "errors",
    "lib.numerics",
    "lib.speedup",
    "lib.op_modes",
    "judge.float64",
    "judge.premises",
    "box.sandbox",
    "lib.registry",
    "lib.cuda_early",
    # building: a candidate's cached builds, the bytecode kept in the cache, torch's header precompiled for them,
    # its box and paths, what a source exports and includes, the compile cache, the CPU-side compile checks, the
    # layers models/ are made of
    "box.builds",
    "lib.bytecode",
    "box.pch",
    "box.start",
    "lib.sources",
    "lib.build",
    "lib.checks",
    "lib.layers",
    # one judged call: the shape family's members, the reference's shape family, the judge's options and clock, the
    # reference, judges sharing a GPU, the timer, profiles, the kernel languages a candidate compiles at run time,
    # what is watched in a candidate's process, a call's backward, the worker's timing, profiling, calling and
    # sanitized-call commands, its replies, its state and setup commands, the worker that runs a model, the runners
    # that talk to it, the boxed worker's entry
    "judge.members",
    "judge.family",
    "judge.options",
    "judge.clock",
    "judge.reference",
    "lib.gpu_lock",
    "lib.timing",
    "observe.profile",
    "worker.languages",
    "worker.guards",
    "judge.window",
    "worker.backward_pass",
    "worker.measuring",
    "worker.profiling",
    "worker.parity_calls",
    "worker.sanitized",
    "worker.replies",
    "worker.state",
    "worker.setup",
    "worker.loop",
    "judge.runners",
    "box.entry",
    # reading and saying: Nsight Compute, the tables
    "observe.ncu",
    "observe.verdict",
    "observe.report",
    # the judge: its memory plan, its cached GPU memory handed back, the one comparison with the float64 reference, an
    # output against what it must be, what a call must return, its stages (construct, the gradients, one checked call,
    # parity, parity at the shape family's members, KernelBench's own check, escape and own kernel, timing and
    # ceilings, profiles, compute-sanitizer's tools), its answers to running out of GPU memory, its record, its stage
    # table, the driver that runs it; its roofline picture; many jobs (what a job, a job file and a results file
    # are; what a batch used of its host; candidates' builds ahead of judging; the reference run in a slot's next
    # box; what runs in a slot's process; the slot a job runs in; the GPUs the slots run on; which slots or Ray tasks
    # run which jobs)
    "judge.plan",
    "judge.release",
    "judge.compare",
    "judge.outputs",
    "judge.expected",
    "judge.probes",
    "judge.construct",
    "judge.backward",
    "judge.calls",
    "judge.parity",
    "judge.family_parity",
    "judge.parity_stage",
    "judge.kernelbench",
    "judge.escape",
    "judge.timed",
    "judge.ceilings",
    "judge.observe",
    "judge.sanitize",
    "judge.memory",
    "judge.record",
    "judge.stages",
    "judge.driver",
    "observe.plot",
    "batch.jobfile",
    "batch.usage",
    "batch.ahead",
    "batch.prime",
    "batch.slot_process",
    "batch.slots",
    "batch.gpus",
    "batch.backends",
    "batch.session",
    "batch.server",
    # the command line's machinery (run.py is its shell)
    "command",
)
