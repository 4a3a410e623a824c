"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with fp16 working copies where the inputs' range allows them
(NUMERICS "auto", else the precise bf16 path) and delta = sum_j P_ij dP_ij from the forward's own dP (one more
product a key block), for `crucible check` / `crucible bench`."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    NUMERICS = "auto"
    DELTA = "dp"
