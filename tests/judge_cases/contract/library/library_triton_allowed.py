"""library_triton.py's model judged with --allow-torch: accepted, and labelled as a rewrite over a library's kernels,
named by package, not as pure PyTorch (SAYS: what the verdict's line must say)."""
from _liger_rms_norm import LigerRMSNorm

EXPECT = None
SAYS = r"^accepted \(a library's kernels: .*_rms_norm_forward_kernel \(liger_kernel's Triton\)"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)
NEEDS = ("liger_kernel",)


class ModelNew(LigerRMSNorm):
    pass
