"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon backward's dq_ordered v2
(seeds/attention_gluon_bwd.py: dQ's share of each step added by the dK/dV kernel into a transposed fp32
accumulator at the program's rank in a rotated order, so no dQ kernel recomputes S and dP), deferred (dq_defer:
each share added under the next step's first products), on the fp16 path, for `crucible bench`. Measured (H200,
accepted on both tasks): 11.2116 ms non-causal, 6.0305 causal, against the seed's 8.5356 / 4.8835;
v1: 12.3055 / 7.6265."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_ordered=True, dq_defer=True), True: dict(dq_ordered=True, dq_defer=True)}
