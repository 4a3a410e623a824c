"""The non-causal attention forward with the Gluon kernel's two consumers, no GEMM token, persistent (a
diagnostic, do_bench: 1.7568 ms against the default's 1.8732 in the same run) as a candidate file for `crucible bench`.
Elsewhere it is seeds/attention.py's ModelNew."""
import torch

from seeds.attention import ModelNew as _Seed
from seeds.attention import gluon_fwd_variant
from seeds.attention_gluon import attention_fwd_gluon


class ModelNew(_Seed):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not self.causal and gluon_fwd_variant(q, k, v, False) is not None:
            return attention_fwd_gluon(q, k, v, False, consumers=2, pingpong=False, persistent=True)[0]
        return super().forward(q, k, v)
