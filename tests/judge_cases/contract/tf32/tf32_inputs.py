"""TF32 tensor cores' arithmetic on fp32 inputs (truncated operands), judged with --precision tf32: accepted. cuBLAS's
TF32 rounds the operands and errs about half as much; both are TF32 arithmetic, so the budget's base is the worse."""
from _truncating import ModelNew  # noqa: F401

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--precision", "tf32")
