"""Pictures of measured numbers: the roofline of a judge's timing table (`run.py --plot PATH`), the speed curve
over a reference's shapes (`run.py --shapes N --plot PATH`) and a bandwidth curve over a sweep
(bench/softmax/plot_sweep.py). Both draw the ceilings measured in the same run as lines, so a
point's distance to its line is what is left to win.

matplotlib is optional (it is not in requirements.txt): `require()` fails in one line, before a run, when it is
missing.
"""

from __future__ import annotations

import math
from pathlib import Path

from kp.errors import UsageError
from kp.observe.report import row_floor_s, row_label, row_names, row_traffic

COLORS = {"baseline": "0.45", "accepted": "tab:green", "rejected": "tab:red"}


def require() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib, which is not installed (pip install matplotlib); the judge itself does not"
        ) from None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def points(rec: dict) -> list[dict]:
    """One point per timed row of a record: label, kind (baseline / accepted / rejected), bytes and flops per
    second at the median time, arithmetic intensity (flops per byte of the row's minimum traffic), and the share of
    the ceiling (the table's %roof)."""
    timing = rec.get("timing", {})
    if "bandwidth" not in rec:
        return []
    out = []
    for k in row_names(rec):
        t = timing.get(k)
        if not t:
            continue
        tr, secs = row_traffic(rec, k), t["median_ms"] * 1e-3
        row = rec["rows"].get(k)
        kind = "baseline" if row is None else ("accepted" if row["accepted"] else "rejected")
        out.append(
            {
                "label": row_label(rec, k),
                "kind": kind,
                "ms": t["median_ms"],
                "bytes_per_s": tr["bytes"] / secs,
                "flops_per_s": tr["flops"] / secs,
                "intensity": tr["flops"] / tr["bytes"] if tr["bytes"] else math.inf,
                "roof": row_floor_s(rec, k) / secs,
            }
        )
    return out


def _title(rec: dict) -> str:
    return f"{rec['reference']} [{rec.get('shape', '')}] on {rec.get('device', '')}, {rec.get('precision', 'fp32')}"


def roofline(rec: dict, path: str | Path) -> Path:
    """Write a PNG of the record's timing table. A problem with flops (a GEMM) gets a roofline: each row at its
    arithmetic intensity and achieved FLOP/s, under the copy-bandwidth slope and the measured GEMM rates. A problem
    of bytes alone (flops 0: softmax, an elementwise op) gets each row's achieved GB/s against the copy ceiling."""
    pts = points(rec)
    if not pts:
        raise UsageError("nothing to plot: the record has no timing table (run without --no-bench, on a GPU)")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    bw = rec["bandwidth"]
    with_flops = [p for p in pts if p["flops_per_s"] > 0 and math.isfinite(p["intensity"])]
    if with_flops and rec.get("flops_rate"):
        lo = min(p["intensity"] for p in with_flops) / 8
        hi = max(p["intensity"] for p in with_flops) * 8
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        for i, (name, rate) in enumerate(sorted(rec.get("rates", {}).items(), key=lambda kv: -kv[1])):
            ax.plot(
                xs,
                [min(bw * x, rate) / 1e12 for x in xs],
                ls="--",
                color=f"{0.2 + 0.2 * i:.1f}",
                label=f"ceiling: cuBLAS {name} {rate / 1e12:,.1f} TFLOP/s, device copy {bw / 1e9:,.0f} GB/s",
            )
        for p in with_flops:
            ax.scatter(p["intensity"], p["flops_per_s"] / 1e12, color=COLORS[p["kind"]], zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _labels(
            ax,
            [(p["intensity"], p["flops_per_s"] / 1e12, f"{p['label']} ({100 * p['roof']:.0f}%)") for p in with_flops],
        )
        ax.set_xlabel("arithmetic intensity (flops per byte of the minimum traffic)")
        ax.set_ylabel("TFLOP/s (the problem's flops over the median time)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8)  # below: clear of the labels
    else:
        ys = list(range(len(pts)))[::-1]
        ax.barh(ys, [p["bytes_per_s"] / 1e9 for p in pts], color=[COLORS[p["kind"]] for p in pts])
        for y, p in zip(ys, pts):
            ax.annotate(
                f" {p['ms']:.3f} ms, {100 * p['roof']:.1f}%", (p["bytes_per_s"] / 1e9, y), va="center", fontsize=8
            )
        ax.set_yticks(ys, [p["label"] for p in pts], fontsize=8)
        ax.axvline(bw / 1e9, color="0.3", ls="--", label=f"ceiling: device copy {bw / 1e9:,.0f} GB/s")
        ax.set_xlim(0, bw / 1e9 * 1.3)
        ax.set_xlabel("GB/s (the problem's minimum bytes over the median time)")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_title(rec), fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _labels(ax, items: list[tuple[float, float, str]], gap: float = 0.045) -> None:
    """Label points on a log-y axis, top to bottom, each at least `gap` of the axis' height (in log units) below
    the one above: rows of one problem share an intensity, and close rates would print over each other. A label
    moved off its point gets a thin line to it."""
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    step, prev = gap * (hi - lo), math.inf
    for x, y, text in sorted(items, key=lambda t: -t[1]):
        ly = min(math.log10(y), prev - step)
        prev = ly
        moved = abs(ly - math.log10(y)) > 1e-9
        ax.annotate(
            text,
            (x, y),
            xytext=(x * 1.15, 10**ly),
            fontsize=8,
            va="center",
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6} if moved else None,
        )
    if prev < lo + step:  # room for the lowest label
        ax.set_ylim(10 ** (prev - step), 10**hi)


def bandwidth_curve(
    xs: list[float], series: dict[str, list[float]], ceiling: float | None, path: str | Path, *, xlabel: str, title: str
) -> Path:
    """GB/s of each series over a sweep (log2 x), with the copy ceiling as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, ys), style in zip(series.items(), ("o-", "s-", "D-", "^-", "v-")):
        ax.plot(xs, ys, style, label=name)
    if ceiling:
        ax.axhline(ceiling, color="gray", ls="--", label=f"device copy {ceiling:,.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GB/s (one read + one write)")
    ax.set_title(title)
    ax.set_ylim(0, (ceiling or max(max(v) for v in series.values())) * 1.1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    return _save(fig, path)


def shape_curve(rec: dict, path: str | Path) -> Path:
    """The speed curve of a record timed with --shapes (kp.observe.report.curve): each judged row's speedup over
    eager (solid) and torch.compile (dashed) at every shape timed, and, where the ceilings were measured, its share
    of them below; shapes by size (the inputs' elements, then their row lengths), each named with its member."""
    from kp.observe.report import curve, curve_label

    pts = sorted(curve(rec), key=_size)
    if not pts:
        raise UsageError("no speed curve in this record: it was not timed at other shapes (--shapes with timing)")
    plt = _pyplot()
    roof = any(p["roof"] for p in pts)
    fig, axes = plt.subplots(
        2 if roof else 1, 1, figsize=(max(7, 1.1 * len(pts)), 6.5 if roof else 4), sharex=True, squeeze=False
    )
    xs = list(range(len(pts)))
    names = [f"{p['shape']}\n({p['member']})" for p in pts]
    rows = [k for k in rec["rows"] if any(k in p["vs_eager"] for p in pts)]
    for k in rows:
        ys = [p["vs_eager"].get(k) for p in pts]
        name = curve_label(rec, pts, k)
        (line,) = axes[0][0].plot(xs, [y if y is not None else math.nan for y in ys], "o-", label=f"{name} vs eager")
        yc = [p["vs_compile"].get(k) for p in pts]
        if any(y is not None for y in yc):
            axes[0][0].plot(
                xs,
                [y if y is not None else math.nan for y in yc],
                "s--",
                color=line.get_color(),
                alpha=0.6,
                label=f"{name} vs torch.compile",
            )
        if roof:
            axes[1][0].plot(
                xs, [100 * p["roof"].get(k, math.nan) for p in pts], "o-", color=line.get_color(), label=name
            )
    axes[0][0].axhline(1.0, color="gray", ls=":")
    axes[0][0].set_ylabel("speedup (x)")
    axes[0][0].set_title(_title(rec) + ": speed at each shape")
    axes[0][0].grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if roof:
        axes[1][0].set_ylabel("% of the ceiling measured")
        axes[1][0].set_ylim(0, 110)
        axes[1][0].grid(alpha=0.3)
    axes[-1][0].set_xticks(xs)
    axes[-1][0].set_xticklabels(names, fontsize=7, rotation=30, ha="right")
    return _save(fig, path)


def _size(point: dict) -> tuple:
    """A shape's place on the curve's axis: the elements of its inputs, then their row lengths ("64x1000, 64": two
    inputs); the shape as written where it does not parse."""
    try:
        dims = [[int(d) for d in part.split("x")] for part in point["shape"].split(", ")]
    except ValueError:
        return (math.inf, (), point["shape"])
    return (sum(math.prod(d) for d in dims), tuple(d[-1] for d in dims), point["shape"])


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def draw(rec: dict, path: str | Path) -> str:
    """A record's picture: the speed curve where it was timed at several shapes (the roofline of its benchmark
    shape beside it, named PATH-roofline), else the roofline. Returns what was drawn, in words."""
    from kp.observe.report import curve

    path = Path(path)
    if curve(rec):
        beside = roofline(rec, path.with_name(f"{path.stem}-roofline{path.suffix}"))
        return f"speed curve: {shape_curve(rec, path)}; roofline at the benchmark's shape: {beside}"
    return f"roofline picture: {roofline(rec, path)}"


def main(argv: list[str] | None = None) -> int:
    """`python -m kp.observe.plot RECORD.json OUT.png`: the picture of a record saved with `run.py --json`, redrawn
    without a GPU (the README's pictures are drawn this way from the records of their runs)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m kp.observe.plot", description=main.__doc__)
    ap.add_argument("record", help="a record written by run.py --json (one problem's, or a list of them)")
    ap.add_argument("png")
    args = ap.parse_args(argv)
    require()
    with open(args.record) as f:
        rec = json.load(f)
    recs = rec if isinstance(rec, list) else [rec]
    for r in recs:
        path = Path(args.png)
        if len(recs) > 1:
            path = path.with_name(f"{path.stem}-{r['reference']}{path.suffix}")
        print(draw(r, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
