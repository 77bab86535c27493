"""Never returns from its first call: the job's time limit kills it."""
import time

import torch.nn as nn

EXPECT = r"^rejected: (.*: )?timeout after"


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            time.sleep(1)
