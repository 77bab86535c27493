"""TF32 tensor cores' arithmetic on fp32 inputs (truncated operands), judged in fp32: rejected, and the verdict names
the cause (the error is the truncated-TF32 reference's, measured on the same call) and the fix."""
from _truncating import ModelNew  # noqa: F401

EXPECT = r"over budget .*TF32 tensor cores fed fp32 inputs .*input_precision=\"ieee\""
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)
