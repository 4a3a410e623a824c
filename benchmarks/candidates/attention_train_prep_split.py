"""The fwd+bwd tasks' seed (seeds/attention_bwd.py) with the fp16 preparation as a launch a tensor (the largest
magnitudes, then the copies) instead of one launch over the four, for `crucible bench`: run BC profiled the
one-launch kernels at 170 us (amax) and 255 us (copies), about 1.5-2 TB/s."""
from seeds.attention_bwd import ModelNew as _Seed


class ModelNew(_Seed):
    PREP_SPLIT = True
