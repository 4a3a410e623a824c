"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon backward's dq_ordered v2
(seeds/attention_gluon_bwd.py: dQ's share of each step added by the dK/dV kernel into a transposed fp32
accumulator at the program's rank in a rotated order, so no dQ kernel recomputes S and dP), deferred (dq_defer:
each share added under the next step's first products), on the fp16 path, for `crucible bench`. v2 NOT MEASURED
ON THE GPU YET (v1, run BF: 12.42 / 7.60 ms fwd+bwd against 9.08 / 5.15 with the dQ kernel); deferred is the guess
at the faster of v2's two rows in benchmarks/sweep_attention_train.py."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    BWD = {False: dict(dq_ordered=True, dq_defer=True), True: dict(dq_ordered=True, dq_defer=True)}
