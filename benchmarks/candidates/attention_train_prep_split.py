"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the fp16 preparation as a launch a tensor (the largest
magnitudes, then the copies: prep="split") instead of the fused one, for `crucible bench`: measured on the H200, the
split preparation was no faster than one launch over the four (prep="two"); the fused preparation (one
read of each input) replaced both."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    PREP = "split"
