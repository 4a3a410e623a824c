"""Allocates (and touches) more host memory than its bound allows: the kernel must end it, and the zygote must
report the kill so the verdict can say the bound was exceeded. torch.ones fills every page in C, where no
Python-level layer looks.

Reads walls_env.json from ../io, beside its scratch directory (a tmpfs of its own the host does not see)."""
import json

import torch

env = json.load(open("../io/walls_env.json"))
hoard = [torch.ones(1 << 26) for _ in range(int(env["gib"] * 4))]  # 256 MiB each
