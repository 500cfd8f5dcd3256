"""The Tensor's operations, grouped by domain. Each module holds one mixin class that `rawgrad.tensor.Tensor`
inherits; methods build new tensors from the core operations in tensor.py, so they stay lazy and differentiable.
Mixins must not import rawgrad.tensor at module level (tensor.py imports them); use `type(self)` or a local import.
"""
