"""gemm_bn_scale_softmax with the right training-mode output (batch statistics) but running statistics that are
never updated: the next eval-mode call would be wrong. Only the buffer check catches it."""
import torch
import torch.nn as nn
import torch.nn.functional as F

PROBLEM = "gemm_bn_scale_softmax"
EXPECT = r"buffer bn\.(running_mean|running_var|num_batches_tracked)"
KIND = "wrong_state"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bn_eps=1e-5, bn_momentum=0.1, scale_shape=(1,)):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum)
        self.scale = nn.Parameter(torch.ones(scale_shape))

    def forward(self, x):
        y = self.gemm(x)
        y = F.batch_norm(y, None, None, self.bn.weight, self.bn.bias, training=True, eps=self.bn.eps)
        return torch.softmax(self.scale * y, dim=1)
