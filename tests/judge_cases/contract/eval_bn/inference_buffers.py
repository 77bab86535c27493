"""Conv then BatchNorm for inference, the BatchNorm's running statistics made inside torch.inference_mode() at
construction (inference tensors, which refuse an in-place copy outside that mode). A user's process never loads a
state into them; the judge loads the reference's weights in the mode PyTorch allows for such tensors. Accepted with
--mode eval."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--mode", "eval")


class ModelNew(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        self.bn = nn.BatchNorm2d(cout)
        with torch.inference_mode():
            self.bn.running_mean = torch.zeros(cout)
            self.bn.running_var = torch.ones(cout)

    def forward(self, x):
        bn = self.bn
        return F.batch_norm(self.conv(x), bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
