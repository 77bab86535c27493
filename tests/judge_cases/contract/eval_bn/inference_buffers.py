"""Conv then BatchNorm for inference, the BatchNorm made inside torch.inference_mode() at construction (its
parameters and running statistics are inference tensors). A user's process never loads a state into it; the judge
loads the reference's weights in the mode PyTorch allows for such tensors. Accepted with --mode eval."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--mode", "eval")


class ModelNew(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        with torch.inference_mode():
            self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        with torch.inference_mode():
            y = self.bn(self.conv(x))
        return y.clone()
