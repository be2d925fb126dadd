"""minigrad_norm: reverse-mode autodiff on NumPy, built to study backprop through normalization layers.

>>> import numpy as np, minigrad_norm as mg
>>> x = mg.Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
>>> ((x * x).sum()).backward()
>>> x.grad
array([2., 4., 6.])
"""

from minigrad_norm.backend import get_backend, set_backend, use_backend
from minigrad_norm.gradcheck import GradcheckError, gradcheck, jacobian, numerical_jacobian
from minigrad_norm.ops import concatenate, stack
from minigrad_norm.tensor import (
    Context,
    Function,
    Tensor,
    enable_grad,
    grad,
    increment_version,
    is_grad_enabled,
    no_grad,
)

__version__ = "0.1.0"

__all__ = [
    "Context",
    "Function",
    "GradcheckError",
    "Tensor",
    "__version__",
    "concatenate",
    "enable_grad",
    "get_backend",
    "grad",
    "gradcheck",
    "increment_version",
    "is_grad_enabled",
    "jacobian",
    "no_grad",
    "numerical_jacobian",
    "set_backend",
    "stack",
    "use_backend",
]
