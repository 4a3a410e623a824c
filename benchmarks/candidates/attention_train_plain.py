"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the earlier backward launch: the dQ kernel launched after
the dK/dV kernel, not by programmatic dependent launch, and causal programs head by head (group_heads=0), for
`crucible bench` against the seed (pdl; causal grouped by 4 heads): the A/B behind seeds/attention_gluon_train.py's
BWD_KNOBS."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_block_n=128), True: dict(dq_block_n=128)}
