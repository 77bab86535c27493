"""A rewrite over an installed library's Triton kernels (liger_kernel's RMSNorm): right, but no kernel of the
candidate's own runs. Rejected without --allow-torch, the reason naming the library's kernels by package (not "pure
PyTorch", nor a bare list of kernels seen); library_triton_allowed.py is the same model judged with it."""
from _liger_rms_norm import LigerRMSNorm

EXPECT = (
    r"own kernel: no kernel of the row's own ran; a library's kernels did "
    r"\(.*_rms_norm_forward_kernel \(liger_kernel's Triton\)"
)
KIND = "own_kernel"
DEVICES = ("cuda",)
NEEDS = ("liger_kernel",)


class ModelNew(LigerRMSNorm):
    pass
