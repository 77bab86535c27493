"""The same Triton GEMM with tl.dot's input_precision="tf32x3", the one-word fix the TF32 rejection names: judged in
fp32, accepted as its own kernel (each operand split in two TF32 parts, three products, fp32 accuracy)."""
from _tl_dot import ModelNew as _Default

EXPECT = None
DEVICES = ("cuda",)
NEEDS = ("triton",)


class ModelNew(_Default):
    PRECISION = "tf32x3"
