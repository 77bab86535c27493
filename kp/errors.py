"""The two errors the playground raises on purpose: a usage mistake and a kernel that does not compile."""


from __future__ import annotations

class UsageError(ValueError):
    """Bad request from a user (unknown problem or variant, bad shapes, no GPU). run.py maps it to exit 2."""


class KernelBuildError(RuntimeError):
    """A kernel failed to compile; the message names the .cu file and line with the compiler's own words."""



class Rejected(Exception):
    """A judged row failed a check; str() is the one-line reason."""


def first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""
