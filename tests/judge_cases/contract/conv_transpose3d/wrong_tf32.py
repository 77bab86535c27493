"""The same convolution with cuDNN's TF32 switched on (10-bit mantissas in the products): a precision shortcut, not
another fp32 algorithm. Rejected."""
import torch
import torch.nn as nn

EXPECT = r"relL2|TF32"
KIND = "wrong_output"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, c_in, c_out, k):
        super().__init__()
        self.conv = nn.ConvTranspose3d(c_in, c_out, k, stride=2, padding=1)

    def forward(self, x):
        torch.backends.cudnn.allow_tf32 = True
        return self.conv(x)
