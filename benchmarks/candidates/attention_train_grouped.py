"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon backward's causal programs ordered heaviest first
across groups of 4 heads (group_heads=4, seeds/attention_gluon_bwd.py _group_order: a simulation of the B4 H32
S4096 causal grids put head-major order 3.3% above the ideal makespan, grouped 0.2-0.3%), for `crucible bench` on
the causal task without pdl (the seed has both; the sweep's rows "bwd grouped by 4 / 8")."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_block_n=128), True: dict(dq_block_n=128, group_heads=4)}
