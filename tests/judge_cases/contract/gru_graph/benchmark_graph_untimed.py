"""The same graph-replayed GRU (cuDNN's autotuner on, three plain calls, then a capture on a side stream), judged
with --no-bench: the timed calls are few and each is checked. Accepted."""
from benchmark_graph import ModelNew  # noqa: F401

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch", "--no-bench")
