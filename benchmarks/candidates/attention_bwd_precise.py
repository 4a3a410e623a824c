"""The attention fwd+bwd seed (seeds/attention_bwd.py) with its `precise` numerics on: delta = sum_j P_ij dP_ij from
the forward's own dP product, dS as hi + lo operands of the dK and dQ products. A candidate file for `crucible check`
and `crucible bench` on the H200 (benchmarks/gpu_attention_next.sh) until the seed's default is decided by them."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    def __init__(self, causal: bool = False):
        super().__init__(causal)
        self.precise = True
