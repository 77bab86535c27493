"""A judge kept warm between commands (`run.py --warm ...`, or KP_WARM=1): the first such command starts a server in the
background and is judged in its own process as usual, meanwhile the server starts; every later one hands its command
line to the server and prints what it answers. The server owns one batch slot (kp.batch.slots: a judge process with
torch imported and CUDA's context made, which keeps the ceilings it measures; replaced if it dies), which runs
`run.py`'s own main() on the command, so the output, the record and the exit code are the command's (the judge's
progress on stderr as it goes, the rest at the end). As each command starts (and at its own start, for the command
that started it) the slot starts the box for the same candidate's next judgement (a kernel author re-running the
file after an edit: the box binds the candidate's folder, so it sees the new file), so the next command pays neither
torch's import nor the box's start (kp.batch.slot_process.run_command). The server leaves after IDLE_S without a
command, or at `run.py --warm-stop`.

One server per user, device (`--device cpu`, or the GPUs CUDA_VISIBLE_DEVICES names), the judge's own code (its
files' sizes and times) and the KP_* settings: a command that differs in any of these gets a server of its own, and
a server whose code changed is never asked. The socket lives in a folder only its user can enter, and every
connection proves the key kept beside it.

This module's client side imports nothing heavier than the standard library: a command that finds its server never
imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IDLE_S = float(os.environ.get("KP_WARM_IDLE_S", 900))  # a server with no command for this long leaves
START_S = 120  # the most a command waits for a server it started to answer


def _folder() -> Path:
    d = Path(tempfile.gettempdir()) / f"kp-warm-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    if d.stat().st_uid != os.getuid() or d.stat().st_mode & 0o077:
        raise RuntimeError(f"{d} is not this user's alone: no warm judge")
    return d


def server_key(argv: list[str]) -> str:
    """What a server is for: the device the command asks for (and the GPUs this process sees), the judge's own code,
    the KP_* settings and the interpreter."""
    device = "cpu" if _device(argv) == "cpu" else "cuda:" + os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    code = [
        (str(p.relative_to(ROOT)), p.stat().st_size, p.stat().st_mtime_ns)
        for d in ("kp", "models")
        for p in sorted((ROOT / d).rglob("*.py"))
    ]
    code += [(f, (ROOT / f).stat().st_size, (ROOT / f).stat().st_mtime_ns) for f in ("run.py", "harness.py")]
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("KP_") and k not in ("KP_WARM",))
    blob = json.dumps([device, code, env, sys.executable]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _device(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--device="):
            return a.split("=", 1)[1]
    return None


def _paths(key: str) -> tuple[Path, Path, Path]:
    d = _folder()
    return d / f"{key}.sock", d / f"{key}.key", d / f"{key}.log"


def wanted(argv: list[str]) -> bool:
    """Whether this command asks for the warm judge (--warm, or KP_WARM=1)."""
    return "--warm" in argv or os.environ.get("KP_WARM") == "1"


def run_warm(argv: list[str]) -> int | None:
    """The command run by its warm server: its exit code, with its output printed here; None where there was none
    (one is started then, for the next commands, with this command's box started ahead) or it could not be reached:
    the command then runs here as usual, and says why."""
    argv = [a for a in argv if a != "--warm"]
    try:
        key = server_key(argv)
        conn = _connect(key, argv)
    except Exception as e:  # noqa: BLE001 (whatever stops the warm judge, the command still gets its verdict)
        print(f"[kp] no warm judge ({type(e).__name__}: {e}); judging in this process", file=sys.stderr)
        return None
    if conn is None:
        print(
            "[kp] a warm judge is starting for the next commands (`python run.py --warm-stop` ends it); this one "
            "is judged in this process",
            file=sys.stderr,
        )
        return None
    log = _paths(key)[2]
    with conn:
        said = False
        try:
            conn.send({"argv": argv, "cwd": os.getcwd()})
            res = conn.recv()
            while "say" in res:  # the judge's progress, as it goes
                sys.stderr.write(res["say"])
                sys.stderr.flush()
                said = True
                res = conn.recv()
        except (EOFError, OSError):
            if not said:  # it left as this command came (its idle time was up): judged here instead
                print("[kp] the warm judge left before taking the command; judging in this process", file=sys.stderr)
                return None
            print("error: the warm judge ended before answering; its log is " + str(log), file=sys.stderr)
            return 2
    sys.stderr.write(res.get("stderr", ""))
    print(
        f"[kp] judged by the warm judge (pid {res.get('pid')}, command {res.get('served')} since its start; "
        f"`python run.py --warm-stop` ends it)",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.write(res.get("stdout", ""))  # last: the verdict is the last line, with 2>&1 too
    return int(res.get("rc", 2))


def _connect(key: str, argv: list[str]):
    """A connection to the server for `key`, or None where none was running: one is started then (under a lock, so
    that two commands at once start one server), for the commands after this one; a server found dead (its socket
    refuses, its key is stale) is replaced."""
    import fcntl
    from multiprocessing.connection import Client

    sock, keyfile, log = _paths(key)
    for attempt in range(2):
        with open(sock.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not sock.exists():  # none yet: started now, for the next commands (it listens before it imports
                _start_server(key, argv)  # torch: the lock is held until then, so one command starts one)
                deadline = time.monotonic() + START_S
                while not (sock.exists() and keyfile.exists()):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no answer in {START_S} s (its log: {log})")
                    time.sleep(0.02)
                return None
        try:
            return Client(str(sock), family="AF_UNIX", authkey=keyfile.read_bytes())
        except Exception:  # noqa: BLE001 (refused, or a key from a server that is gone: a fresh server)
            if attempt:
                raise
            sock.unlink(missing_ok=True)
            keyfile.unlink(missing_ok=True)


def stop() -> int:
    """--warm-stop: every warm judge of this user ends (each finishes the command it runs first)."""
    from multiprocessing.connection import Client

    n = 0
    for sock in _folder().glob("*.sock"):
        try:
            with Client(str(sock), family="AF_UNIX", authkey=sock.with_suffix(".key").read_bytes()) as conn:
                conn.send({"stop": True})
                conn.recv()
                n += 1
        except (OSError, EOFError):
            sock.unlink(missing_ok=True)
    print(f"{n} warm judge(s) stopped")
    return 0


def _start_server(key: str, argv: list[str]) -> None:
    sock, keyfile, log = _paths(key)
    with open(log, "ab") as f:
        subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), "--warm-serve", key, json.dumps({"argv": argv, "cwd": os.getcwd()})],
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=f,
            start_new_session=True,
            cwd=str(ROOT),
        )


def serve(key: str, first: str | None = None, slot_main=None) -> int:
    """The server's loop (`run.py --warm-serve KEY FIRST`): it listens at once (a command that comes while it starts
    waits for it), starts its slot and there the box of the command that started it (FIRST: its command line and
    folder), then runs one command at a time in the slot; it leaves after IDLE_S without one, at a stop, or when its
    code changed (a later command gets a fresh one). slot_main: the slot's process function, which runs a command
    line as the command line does (kp.command.warm_slot_main: handed in, the library does not import it)."""
    import threading
    from multiprocessing.connection import Listener

    sock, keyfile, _ = _paths(key)
    authkey = secrets.token_bytes(32)
    sock.unlink(missing_ok=True)
    listener = Listener(str(sock), family="AF_UNIX", authkey=authkey)
    keyfile.unlink(missing_ok=True)
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, authkey)
    os.close(fd)
    from kp.batch.slots import DEFAULT_TIMEOUT_S, Slot

    # on the GPUs this process sees, as the command that started it saw them; slot_main runs command lines
    slot = Slot(None, None, **({"main": slot_main} if slot_main else {}))
    first = json.loads(first) if first else None
    if first:
        slot.submit_command({**first, "ahead_only": True})
        while slot.poll(DEFAULT_TIMEOUT_S) is None:
            time.sleep(0.05)
    last = [time.monotonic()]
    busy = threading.Lock()
    mode = ["--device", "cpu"] if first and _device(first["argv"]) == "cpu" else []

    def idle_watch():  # idle too long, or the judge's code or settings changed since the start: a command would get
        while True:  # a server of its own, and this one would wait out its idle time holding memory
            time.sleep(5)
            if not busy.locked() and (time.monotonic() - last[0] > IDLE_S or server_key(mode) != key):
                _leave(slot, sock, keyfile)

    threading.Thread(target=idle_watch, daemon=True).start()
    served = 0
    while True:
        try:
            conn = listener.accept()
        except Exception:  # a client without the key, or gone: not a command
            continue
        with busy, conn:
            try:
                msg = conn.recv()
            except EOFError:
                continue
            if msg.get("stop"):  # (a command with other code or settings has a key, so a server, of its own)
                conn.send({})
                _leave(slot, sock, keyfile)
            served += 1
            slot.submit_command(msg)
            res = None
            while res is None:
                res = slot.poll(DEFAULT_TIMEOUT_S * 4)
                while slot.said:
                    try:
                        conn.send({"say": slot.said.pop(0)})
                    except OSError:
                        slot.said.clear()
                time.sleep(0.01)
            if "rc" not in res:  # the slot died or ran out of time: said as a result of its own
                res = {"rc": 2, "stderr": f"error: the warm judge's slot gave no answer: {res.get('verdict')}\n"}
            res.update(pid=os.getpid(), served=served)
            try:
                conn.send(res)
            except OSError:  # the command was interrupted meanwhile: nobody to tell
                pass
            last[0] = time.monotonic()


def _leave(slot, sock: Path, keyfile: Path) -> None:
    """Gone, and its files with it (the log too: a server that dies instead keeps it for whoever looks)."""
    for f in (sock, keyfile, sock.with_suffix(".log")):
        f.unlink(missing_ok=True)
    slot.close()
    os._exit(0)
