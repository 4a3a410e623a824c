"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the Gluon kernels held to the precise bf16 numerics on
sm_90 (forward delta from dP, dS split in two bf16 operands) whatever the inputs' range: the control for the fp16
working copies, for `crucible check` / `crucible bench`."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    NUMERICS = "bf16"
