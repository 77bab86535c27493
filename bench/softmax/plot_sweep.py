"""Plot the softmax bandwidth curve from the sweep table in docs/softmax.md (the measured numbers, not a re-run).

  python -m bench.softmax.plot_sweep [--readme docs/softmax.md] [--out docs/softmax_sweep.png]
Needs matplotlib (not in requirements.txt: the plot is optional). The table is the last (newest) one whose header
starts with '| cols | rows | eager'; its caption above gives the copy ceiling ('copy ceiling N GB/s').
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
ap = argparse.ArgumentParser()
ap.add_argument("--readme", default=str(ROOT / "docs" / "softmax.md"))
ap.add_argument("--out", default=str(ROOT / "docs" / "softmax_sweep.png"))
args = ap.parse_args()

lines = Path(args.readme).read_text().splitlines()
start = next((i for i, l in reversed(list(enumerate(lines))) if l.startswith("| cols | rows | eager")), None)
if start is None:
    sys.exit("no sweep table ('| cols | rows | eager ...') in " + args.readme)
head = [c.strip() for c in lines[start].strip("|").split("|")]
rows = []
for l in lines[start + 2 :]:
    if not l.startswith("|"):
        break
    rows.append([c.strip() for c in l.strip("|").split("|")])
caption = " ".join(lines[max(0, start - 4) : start])
m = re.search(r"copy ceiling ([\d,]+) GB/s", caption)
ceiling = float(m.group(1).replace(",", "")) if m else None


def col(name):
    return [float(r[head.index(name)].replace(",", "")) for r in rows]


from kp.observe.plot import bandwidth_curve

series = {{"auto": "ours (ModelNew auto)"}.get(n, "torch " + n): col(n) for n in ("eager", "compile", "auto")}
print(
    "wrote",
    bandwidth_curve(
        col("cols"),
        series,
        ceiling,
        args.out,
        xlabel="columns (rows chosen for ~6.4 GB of input)",
        title="fp32 softmax on H200",
    ),
)
