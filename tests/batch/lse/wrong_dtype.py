"""Right values, returned as float64."""
import models.matmul_sum_max_mean_lse as m

EXPECT = r"output is Tensor .*float64"


class ModelNew(m.ModelNew):
    def forward(self, x):
        return super().forward(x).double()
