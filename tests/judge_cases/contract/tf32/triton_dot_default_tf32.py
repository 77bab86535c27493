"""A Triton GEMM with tl.dot at its default input precision, judged with --precision tf32: accepted, as its own kernel
(TF32 tensor cores truncate the fp32 operands, about twice cuBLAS's rounded TF32 error: both are TF32 arithmetic)."""
from _tl_dot import ModelNew  # noqa: F401

EXPECT = None
DEVICES = ("cuda",)
NEEDS = ("triton",)
FLAGS = ("--precision", "tf32")
