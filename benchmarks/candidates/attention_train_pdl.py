"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon backward's dQ kernel launched by programmatic
dependent launch (pdl=True, seeds/attention_gluon_bwd.py: every dK/dV program lets the dQ kernel launch once it has
started, so dQ's programs take the SMs the dK/dV grid's last wave leaves idle: 4096 programs are 31.03 waves on 132
SMs) and, causal, the programs heaviest first across groups of 4 heads (group_heads=4), for `crucible bench`. NOT
MEASURED ON THE GPU YET (the seed: 8.5356 / 4.8835 ms, runs BH, BI)."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_block_n=128, pdl=True), True: dict(dq_block_n=128, group_heads=4, pdl=True)}
