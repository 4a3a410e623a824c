"""The attention fwd+bwd seed (seeds/attention_bwd.py) with its `precise` numerics on: delta = sum_j P_ij dP_ij from
the forward's own dP product, dS as hi + lo operands of the dK and dQ products. A candidate file for `crucible check`
and `crucible bench` on the H200 (its measurement: docs/results.md, row attention_fwd_bwd, earlier measurements);
the precise numerics became the seed's default after it, so these are the same kernels as seeds/attention_bwd.py's
Triton path now."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    def __init__(self, causal: bool = False):
        super().__init__(causal)
        self.precise = True
