"""The Tensor's operations, grouped by domain. Each module holds one mixin class that `rawgrad.tensor.Tensor`
inherits; methods build new tensors from the core operations in tensor.py, so they stay lazy and differentiable.
No module here imports rawgrad.tensor (it imports them): what they share with it is in helpers.py, below both.
"""
