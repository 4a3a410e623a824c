"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon backward's causal programs ordered heaviest first
across groups of 4 heads (group_heads=4, seeds/attention_gluon_bwd.py _group_order: a simulation of the B4 H32
S4096 causal grids put head-major order 3.3% above the ideal makespan, grouped 0.2-0.3%), for `crucible bench` on
the causal task. NOT MEASURED ON THE GPU YET (the seed, head-major: 4.8835 ms = 394.0 TFLOP/s, run BI)."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_block_n=128), True: dict(dq_block_n=128, group_heads=4)}
