"""The playground's rung 1_colsum_gemv as a candidate."""
import models.matmul_sum_max_mean_lse as m

EXPECT = None


class ModelNew(m.ModelNew):
    def __init__(self, *init):
        super().__init__(*init, variant="1_colsum_gemv")
