"""The normalization layers, each one graph node with a hand-derived backward.

One module per norm, each stating its forward, what it saves, its backward and
its closed-form Jacobian in its docstring; all of them run the shared node
``Normalize`` (``_node.py``) on a 4-D view of their input, and its formulas are
the two functions ``norm_forward`` and ``norm_backward`` of
``minigrad_norm/kernels/reference.py`` (numba's twins run by default: step
through the NumPy ones inside ``with minigrad_norm.use_backend("numpy"):``):

    layer_norm / rms_norm   (rows, 1, D, 1)     per sample
    group_norm              (N, G, C/G, S)      per sample
    instance_norm           (N, C, 1, S)        per sample
    batch_norm              (N, C, 1, S)        per channel (statistics over N and S)
"""

from minigrad_norm.norms.batch_norm import batch_norm
from minigrad_norm.norms.group_norm import group_norm
from minigrad_norm.norms.instance_norm import instance_norm
from minigrad_norm.norms.layer_norm import layer_norm
from minigrad_norm.norms.rms_norm import rms_norm

__all__ = ["batch_norm", "group_norm", "instance_norm", "layer_norm", "rms_norm"]
