"""The box a candidate's worker runs in: bubblewrap (`bwrap`) namespaces around a fresh interpreter.

Inside the box the candidate sees, read-only, the system (/usr, /etc, /opt, /sys), the interpreter and its
packages, the CUDA toolkit, the project, the reference and the candidate's own folder, and the playground's kernel
cache; it writes only to a private /tmp (a size-capped tmpfs that also holds its own `load_inline` builds and
caches), to /dev/shm and to the judge's multiprocessing folder (tensors cross the box's wall through shared
memory, handed-over file descriptors and CUDA IPC). It gets the GPU device
nodes, its own pid, network (loopback only, down), IPC and host-name namespaces, a scrubbed environment, and limits
on processes, open files and host memory (set by `kp.box.entry` before anything else runs). The judge kills the box at
its time limits; every process in it dies with it (pid namespace).

Why these choices:
- The uid stays the judge's: CUDA refuses to map memory exported by a process of another user, and the judge and
  the worker exchange inputs and outputs that way in both directions.
- A process limit (RLIMIT_NPROC) binds every user except root. For root the box's own pid namespace gets a
  `pid_max` (kernels from 6.14 keep one per namespace), else a `pids` cgroup where the judge may create one; where
  neither is possible the record says so.
- Root keeps its capabilities in a box without a user namespace, and with them could remount the read-only binds
  writable: the box is started with every capability dropped but the two `kp.box.entry` needs to set `pid_max`, and
  `kp.box.entry` drops those (and the bounding set) before anything else runs, refusing to go on if any is left.
- Host memory is bounded with RLIMIT_DATA, not RLIMIT_AS: CUDA reserves far more address space than it uses.

`KP_BWRAP` names the bwrap binary when it is not on PATH; `KP_SANDBOX_MEM_GB` sets the host-memory limit.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

GiB = 1 << 30

# Environment a candidate keeps: how to find the GPU, the compilers and the playground's own settings. The
# variables torch.utils.cpp_extension reads into a build's command line (compilers, nvcc, include paths) stay as
# the judge has them, so a candidate's extension built outside the box (a warm corpus run, an earlier
# unboxed judgement) is the same build inside it and ninja finds nothing to redo.
KEEP_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "TORCH_CUDA_ARCH_LIST",
    "OMP_NUM_THREADS",
    "PYTHONHASHSEED",
    "MAX_JOBS",
    "CC",
    "CXX",
    "CUDAHOSTCXX",
    "PYTORCH_NVCC",
    "CUDA_INC_PATH",
    "CUDNN_HOME",
    "CUDNN_PATH",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "TORCH_DONT_CHECK_COMPILER_ABI",
    "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES",
    "ATEN_CPU_CAPABILITY",
    "MKL_NUM_THREADS",
    "THP_MEM_ALLOC_ENABLE",
)
KEEP_PREFIXES = ("KP_", "NVIDIA_")


@dataclasses.dataclass(frozen=True)
class Limits:
    nproc: int = 2048  # processes and threads: torch's pools and a parallel nvcc build stay far below
    nofile: int = 4096
    host_mem: int = 0  # bytes of RLIMIT_DATA; 0: KP_SANDBOX_MEM_GB, else half the host's memory (16 GiB at least)
    tmp: int = 16 * GiB  # the private /tmp

    def data_bytes(self) -> int:
        if self.host_mem:
            return self.host_mem
        if os.environ.get("KP_SANDBOX_MEM_GB"):
            return int(float(os.environ["KP_SANDBOX_MEM_GB"]) * GiB)
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return max(16 * GiB, total // 2)

    def settings(self) -> dict[str, int]:
        """What `kp.box.entry` sets before anything else runs: rlimits, and the namespace's pid_max for root."""
        out = {
            "RLIMIT_NPROC": self.nproc,
            "RLIMIT_NOFILE": self.nofile,
            "RLIMIT_DATA": self.data_bytes(),
            "RLIMIT_CORE": 0,
        }
        if process_limit() == "pid_max":
            out["pid_max"] = self.pid_max()
        return out

    def pid_max(self) -> int:
        """The box's pid_max when it bounds root's processes: pids 1..pid_max-1, the box's init among them."""
        return max(self.nproc + 1, PID_MAX_MIN)


def bwrap_path() -> str | None:
    return os.environ.get("KP_BWRAP") or shutil.which("bwrap")


@functools.lru_cache(maxsize=None)
def status() -> tuple[str | None, str]:
    """(bwrap's path, "") where a box can be made on this machine, else (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, f"the sandbox needs Linux namespaces (this is {sys.platform})"
    b = bwrap_path()
    if not b:
        return None, "no bwrap found (install bubblewrap, or set KP_BWRAP to its binary)"
    try:
        r = subprocess.run(
            [b, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{b} does not run: {e}"
    if r.returncode:
        err = (r.stderr.strip().splitlines() or ["exit code %d" % r.returncode])[-1]
        return None, f"{b} cannot make namespaces here: {err}"
    return b, ""


def _covered(p: str, binds: list[str]) -> bool:
    return any(p == b or p.startswith(b.rstrip("/") + "/") for b in binds)


PRIVATE = ("/tmp", "/dev", "/proc")  # the box's own: a read-only bind over them would hide its /tmp, devices, pids


def cuda_toolkit() -> str | None:
    """The CUDA toolkit's folder as torch's extension builder finds it (CUDA_HOME, CUDA_PATH, nvcc's parent, then
    /usr/local/cuda), found without importing torch: the box may be started before torch is imported."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
    return os.path.realpath(home) if os.path.isdir(home) else None


def _ro_paths(extra: list[str]) -> list[str]:
    """What the box reads: system folders, the interpreter and its packages, the CUDA toolkit, sys.path and the
    given paths; each once (a path under another is covered by it), none under /tmp's tmpfs unless given. A
    folder that is or holds one of the box's own places (a candidate saved straight in /tmp, or a script run from
    /tmp, which puts /tmp on sys.path) is left out, or the box's private /tmp would be the host's, read-only;
    the files given with it are bound one by one."""
    cand = ["/usr", "/etc", "/opt", "/sys"]
    cand += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    try:
        cand += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site.py
        pass
    cuda_home = cuda_toolkit()
    if cuda_home:
        cand.append(cuda_home)
    for tool in ("ninja", "nvcc", "gcc", "c++"):
        w = shutil.which(tool)
        if w:
            cand.append(os.path.dirname(os.path.realpath(w)))
    cand += [p for p in sys.path if p and os.path.isdir(p)]
    cand += extra
    cand = [p for p in cand if not any(_covered(q, [os.path.realpath(p)]) for q in PRIVATE)]
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in cand if p and os.path.exists(p)}, key=len):
        if p != "/" and not _covered(p, out):
            out.append(p)
    return out


def _parents(p: str) -> list[str]:
    out, a = [], os.path.dirname(p)
    while a not in ("/", ""):
        out.insert(0, a)
        a = os.path.dirname(a)
    return out


def command(
    argv: list[str], *, read_only: list[str], writable: list = (), cwd: str, env: dict, limits: Limits
) -> list[str]:
    """The bwrap command line that runs argv in a box (see the module's docstring)."""
    b, why = status()
    if b is None:
        raise RuntimeError(why)
    args = [
        b,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "kp-box",
    ]
    if os.geteuid() != 0:
        args += ["--unshare-user", "--disable-userns"]
    else:  # root keeps capabilities unless told; kp.box.entry drops the two it is left after setting pid_max
        args += ["--cap-drop", "ALL"]
        if process_limit() == "pid_max":
            args += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
    args += ["--proc", "/proc", "--dev", "/dev", "--dev-bind", "/dev/shm", "/dev/shm"]
    for d in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", d, d]
    for link in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    args += ["--perms", "1777", "--size", str(limits.tmp), "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp"}
    for p in _ro_paths(read_only):
        for a in _parents(p):
            if a not in made and not os.path.islink(a) and a not in ("/lib", "/lib64", "/bin", "/sbin"):
                made.add(a)
                args += ["--perms", "0755", "--dir", a]  # bwrap would make them 0700
        args += ["--ro-bind", p, p]
    for p in writable:  # a path, bound where it is, or (path, where the box sees it)
        src, dst = p if isinstance(p, tuple) else (p, p)
        args += ["--bind", src, dst]
    if cwd.startswith("/tmp/"):  # a working directory of its own on the private /tmp: fresh, writable, gone after
        args += ["--dir", cwd]
    args += ["--chdir", cwd, "--clearenv"]
    for k, v in env.items():
        args += ["--setenv", k, v]
    return args + ["--"] + argv


def choice(wanted: bool) -> tuple[bool, str]:
    """Whether a candidate's worker runs in a box (wanted, and one can be made here), and what the record says."""
    if not wanted:
        return False, "unsandboxed (--no-sandbox)"
    b, why = status()
    if b is None:
        return False, f"unsandboxed: {why}"
    return True, f"bwrap; process limit by {process_limit()}"


def box_env(env: dict, root: str) -> dict:
    """The judge's environment scrubbed to what a candidate needs; home, caches and builds go to the private /tmp."""
    out = {k: v for k, v in env.items() if k in KEEP_ENV or k.startswith(KEEP_PREFIXES)}
    out.update(
        HOME="/tmp/home",
        TMPDIR="/tmp",
        XDG_CACHE_HOME="/tmp/cache",
        PYTHONPATH=root,
        TORCH_EXTENSIONS_DIR="/tmp/torch_extensions",
        TRITON_CACHE_DIR="/tmp/triton",
        TORCHINDUCTOR_CACHE_DIR="/tmp/inductor",
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    torch = sys.modules.get("torch")  # a box started after this process imported torch runs the CPU kernels this
    if torch is not None and "ATEN_CPU_CAPABILITY" not in out:  # process picked (one PyTorch can round an operator
        out["ATEN_CPU_CAPABILITY"] = torch.backends.cpu.get_cpu_capability().lower()  # differently on each)
    return out


# ---------------------------------------------------------------------------------------------------------------
# A pids cgroup for root, whom RLIMIT_NPROC does not bind.


def _pids_cgroup_parent() -> Path | None:
    """A cgroup folder under which this process may make a child with a pids limit, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for ln in lines:  # cgroup v1: a pids hierarchy
        _, ctrl, path = ln.split(":", 2)
        if "pids" in ctrl.split(","):
            p = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
            if (p / "cgroup.procs").exists() and os.access(p, os.W_OK):
                return p
    for ln in lines:  # cgroup v2: a parent whose children get the pids controller
        if ln.startswith("0::"):
            own = Path("/sys/fs/cgroup") / ln[3:].lstrip("/")
            for p in (own, own.parent):
                try:
                    if "pids" in (p / "cgroup.subtree_control").read_text().split() and os.access(p, os.W_OK):
                        return p
                except OSError:
                    continue
    return None


class PidsCgroup:
    """A cgroup that caps the box's process count (max_pids 0: none); `enter()` runs in the box's first process
    before exec."""

    def __init__(self, max_pids: int):
        self.path = None
        parent = _pids_cgroup_parent() if max_pids > 0 else None
        if parent is None:
            return
        p = parent / f"kp-box-{os.getpid()}-{id(self):x}"
        try:
            p.mkdir()
            (p / "pids.max").write_text(str(max_pids))
            self.path = p
        except OSError:
            try:
                p.rmdir()
            except OSError:
                pass

    def enter(self) -> None:
        if self.path is not None:
            with open(self.path / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


PER_NS_PID_MAX = (6, 14)  # the first kernel whose pid namespaces each have their own pid_max
PID_MAX_MIN = 301  # the kernel refuses a smaller pid_max


def kernel_version() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release) if hasattr(os, "uname") else None
    return (int(m[1]), int(m[2])) if m else (0, 0)


def process_limit() -> str:
    """How the box's process count is bounded for this user: 'rlimit', 'pid_max', 'cgroup' or 'none'.
    Writing pid_max on an older kernel would change the host's, so the kernel's version decides whether it is tried;
    a container that forbids it falls through to the cgroup."""
    if os.geteuid() != 0:
        return "rlimit"
    if _pid_max_settable():
        return "pid_max"
    return "cgroup" if _pids_cgroup_parent() is not None else "none"


@functools.lru_cache(maxsize=None)
def _pid_max_settable() -> bool:
    """Whether a box of root's can set its own pid namespace's pid_max here (tried once, in a box of its own)."""
    b = status()[0]
    if b is None or not sys.platform.startswith("linux") or kernel_version() < PER_NS_PID_MAX:
        return False
    want = str(Limits().pid_max())
    try:
        r = subprocess.run(
            [
                b,
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--unshare-pid",
                "--die-with-parent",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SYS_ADMIN",
                "sh",
                "-c",
                f"echo {want} > /proc/sys/kernel/pid_max && cat /proc/sys/kernel/pid_max",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.strip() == want
