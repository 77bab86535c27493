"""The playground's model plus 1e-2: close, and wrong."""
import models.matmul_sum_max_mean_lse as m

EXPECT = r"over budget"


class ModelNew(m.ModelNew):
    def forward(self, x):
        return super().forward(x) + 1e-2
