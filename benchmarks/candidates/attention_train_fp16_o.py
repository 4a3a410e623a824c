"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the fp16 working copies taking delta = rowsum(dO o O) from
the fp16 o (the forward's two products alone) instead of the forward's dP, for `crucible check` /
`crucible bench`: whether fp16's 3 more bits make the dP product unnecessary."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    DELTA = "o"
