"""A Triton GEMM with tl.dot at its default input precision, judged in fp32: rejected, and the verdict names TF32
tensor cores fed fp32 inputs and the one-word fix (input_precision="ieee" or "tf32x3")."""
from _tl_dot import ModelNew  # noqa: F401

EXPECT = r"over budget .*TF32 tensor cores fed fp32 inputs .*input_precision=\"ieee\""
KIND = "wrong_output"
DEVICES = ("cuda",)
NEEDS = ("triton",)
