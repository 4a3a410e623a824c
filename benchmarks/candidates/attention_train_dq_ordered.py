"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon backward's dq_ordered (seeds/attention_gluon_bwd.py:
dQ's share of each step added by the dK/dV kernel into an fp32 accumulator in key-block order, so no dQ kernel
recomputes S and dP), on the fp16 path, for `crucible bench`. NOT MEASURED ON THE GPU YET."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_ordered=True), True: dict(dq_ordered=True)}
