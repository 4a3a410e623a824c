"""Decoder models written in plain PyTorch, with random weights, for `crucible model`: Llama-style (models/llama.py)
and Mixtral-style MoE (models/mixtral.py). Each file is a model file (docs/model.md): `PRESETS`, `get_model`,
`get_inputs`."""
