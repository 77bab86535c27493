"""The members of a reference's shape family that --shapes names, and what each does to a size: plain Python, no
torch, so that the judge's options (kp.judge.options) check a command line's members where a slot's first imports
are kept light."""

from __future__ import annotations

from kp.errors import UsageError


def _odd(n: int) -> int:
    """An odd size just under n (1023 for 1024, 1001 for 1003): no power of two, no multiple of a tile divides it."""
    return max(1, n - 1 if n % 2 == 0 else n - 2)


# The members --shapes N takes, in order (the first N that apply, a larger one among them: count_order): each maps a
# size to its value there. Odd sizes first (a width assumed a multiple of the tile), then half (fewer rows than a
# hard-coded count: slices clip, an index past the end does not), a batch of one, double (rows past a hard-coded count
# left unwritten), then odd halves and odd doubles.
MEMBERS = (
    ("odd", lambda n, batch: _odd(n)),
    ("half", lambda n, batch: max(1, n // 2)),
    ("one", lambda n, batch: 1 if batch else n),
    ("double", lambda n, batch: 2 * n),
    ("odd half", lambda n, batch: max(1, (n // 2) | 1)),
    ("odd double", lambda n, batch: 2 * n + 1),
)


def count_order(n: int) -> list[str]:
    """The generic members in the order --shapes N takes them: MEMBERS' first N, with a larger member (double) among
    them where N is 2 or more, in the place of the last of them: every smaller member leaves a count written in
    for the benchmark's rows (a loop over 64 rows) right there, and only a larger one finds it. The rest follow in
    MEMBERS' order (a judge's spares)."""
    names = [m for m, _ in MEMBERS]
    if n >= 2 and names.index("double") >= n:
        names.remove("double")
        names.insert(n - 1, "double")
    return names


def said_sizes(sizes: dict) -> str:
    """Sizes changed ({name: (now, there)}) as a verdict or note says them: 'batch_size 6 -> 1, height 12 -> 11'."""
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in sizes.items())


def member_names(names) -> list[str]:
    """Members named on a command line ('odd', 'odd-half' or 'odd half'), checked against MEMBERS."""
    known = [m for m, _ in MEMBERS]
    out = [str(x).strip().replace("-", " ") for x in names]
    bad = [x for x in out if x not in known]
    if bad:
        raise UsageError(
            f"--shapes: no member {', '.join(map(repr, bad))}; a count, or some of "
            f"{', '.join(m.replace(' ', '-') for m in known)}"
        )
    return out


def parse_shapes(text: str):
    """--shapes as given: a count ('4') or members' names ('odd,double')."""
    text = str(text).strip()
    return int(text) if text.isdigit() else tuple(member_names(text.split(",")))


def parse_at(text) -> str | None:
    """--at as given, in one spelling: None (the benchmark's shape), "test" (the sizes the file declares for quick
    checks, TEST_SIZES), a member's name ("half", "odd half") or sizes ("batch_size=64,dim=8192": each a positive
    integer, sorted by name). The names of sizes are checked against the reference's family when it is loaded
    (kp.judge.family.ShapeFamily.at_sizes)."""
    if text is None:
        return None
    text = str(text).strip()
    if not text:
        raise UsageError("--at: a member's name (test, odd, half, ...) or sizes (batch_size=64,dim=8192)")
    if "=" not in text:
        name = text.replace("-", " ")
        known = [m for m, _ in MEMBERS]
        if name != "test" and name not in known:
            raise UsageError(
                f"--at: no member {text!r}; sizes (batch_size=64,dim=8192), test (the file's TEST_SIZES) "
                f"or one of {', '.join(m.replace(' ', '-') for m in known)}"
            )
        return name
    sizes = {}
    for part in text.split(","):
        name, _, value = (x.strip() for x in part.partition("="))
        if not name.isidentifier() or not value.isdigit() or int(value) < 1 or name in sizes:
            raise UsageError(
                f"--at: {part.strip()!r} is not a size: NAME=VALUE, a module-level size of the reference "
                f"and a positive integer, each named once (batch_size=64,dim=8192)"
            )
        sizes[name] = int(value)
    return ",".join(f"{k}={v}" for k, v in sorted(sizes.items()))


def at_values(at: str) -> dict[str, int]:
    """The sizes of an --at given as sizes (parse_at's spelling): {name: value}."""
    return {k: int(v) for k, v in (part.split("=") for part in at.split(","))}
