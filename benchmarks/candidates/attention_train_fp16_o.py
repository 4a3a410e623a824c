"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with fp16 working copies where the inputs' range allows them
(NUMERICS "auto", else the precise bf16 path) and delta = rowsum(dO o O) from the forward's unrounded fp32 o in its
epilogue (the forward's two products alone), for `crucible check` / `crucible bench`."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    NUMERICS = "auto"
    DELTA = "o"
