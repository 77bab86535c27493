"""Entry point of a candidate's worker inside the box (`python -m kp.box.entry FD SETTINGS DIR [cuda|gpu|-]
[dynamo|-]`): confine this process before anything else runs (pid_max of the box's pid namespace for root, every
capability dropped, rlimits), take the judge's key for shared tensors, import what every job needs (while the judge gets
ready: the box may be started before the judge imports torch; with `cuda`, CUDA and the judge's GPU tools too), then
take the job and serve the judge over the inherited socket."""

import ctypes
import json
import multiprocessing
import os
import resource
import sys

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CAP_VERSION_3 = 0x20080522
CAPS = ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def capabilities() -> dict[str, int]:
    with open("/proc/self/status") as f:
        return {k: int(v, 16) for k, v in (ln.split(":") for ln in f) if k in CAPS}


def drop_capabilities() -> None:
    """Empty the bounding, inheritable, permitted, effective and ambient sets; no way back through execve."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if os.geteuid() == 0 and capabilities().get("CapBnd"):  # needs CAP_SETPCAP, which the box leaves root for this
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    data = (_CapData * 2)()
    libc.capset(ctypes.byref(_CapHeader(CAP_VERSION_3, 0)), data)
    left = {k: v for k, v in capabilities().items() if v and (k != "CapBnd" or os.geteuid() == 0)}
    if left:  # a non-root user's bounding set grants nothing; root's would come back with the next execve
        sys.exit(f"kp.box.entry: capabilities left after dropping them: {left}; refusing to run the candidate")


def confine(settings: dict) -> None:
    pid_max = settings.pop("pid_max", None)
    if pid_max:  # this namespace's own (kp.box.sandbox only asks for it on kernels that keep one per namespace)
        with open("/proc/sys/kernel/pid_max", "w") as f:
            f.write(str(pid_max))
        with open("/proc/sys/kernel/pid_max") as f:
            if int(f.read()) != pid_max:
                sys.exit("kp.box.entry: the box's pid_max did not take; refusing to run the candidate")
    drop_capabilities()
    for name, value in settings.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def main() -> None:
    fd, settings, shared = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    kind = sys.argv[4] if len(sys.argv) > 4 else "gpu"  # cuda: warm it too; gpu: a GPU job's imports; -: a CPU job's
    dynamo = len(sys.argv) > 5 and sys.argv[5] == "dynamo"  # the candidate's file asks for torch.compile's machinery
    warm_cuda = kind == "cuda"
    confine(settings)
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    # A CPU tensor crosses the wall as a file descriptor handed over a socket of the sender's multiprocessing
    # folder: the judge's, which the box shares, holds both sides' sockets; the key authenticates each hand-over.
    multiprocessing.current_process().authkey = conn.recv_bytes()
    multiprocessing.current_process()._config["tempdir"] = shared
    early = None
    if warm_cuda:  # CUDA's context made beside torch's import, not after it (kp.lib.cuda_early): this box forks nothing
        from kp.lib import cuda_early

        early = cuda_early.start()
    import importlib
    from kp.box.start import DYNAMO_PRELOAD, WORKER_PRELOAD
    from kp.worker.loop import worker_main

    # what its job needs, imported while the judge gets ready (the box may start early)
    for name in WORKER_PRELOAD + DYNAMO_PRELOAD * dynamo:
        importlib.import_module(name)
    if warm_cuda:  # a box started ahead of its job: CUDA's context and the judge's GPU tools too (the job's own
        from kp.worker.setup import warm_up  # environment is the box's: CUDA reads the same one now)

        cuda_early.wait(early)
        try:
            warm_up("cuda", dynamo)
        except Exception:
            pass  # no usable GPU here: the job's own commands say so
    args = conn.recv()
    worker_main(conn, *args)


if __name__ == "__main__":
    main()
