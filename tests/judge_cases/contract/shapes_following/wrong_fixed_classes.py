"""Cross-entropy over a class count written in: wrong wherever the member moves num_classes. Accepted without
--shapes."""
import torch
import torch.nn as nn

EXPECT = r"^shapes: right at 512x10, 512 only, wrong at 511x9, 511 \(odd sizes\): .*raised RuntimeError"
KIND = "raised"
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch", "--shapes", "4")


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        logits = predictions.reshape(-1, 10)
        picked = logits.gather(1, targets.view(-1, 1)).squeeze(1)
        return (torch.logsumexp(logits, dim=1) - picked).mean()
