"""Right output, but it halves its input in place."""
import models.matmul_sum_max_mean_lse as m

EXPECT = r"input 0 was modified"


class ModelNew(m.ModelNew):
    def forward(self, x):
        out = super().forward(x)
        x.mul_(0.5)
        return out
