"""numba kernels (placeholder until the kernels land: re-exports the reference)."""

from minigrad_norm.kernels.reference import erf, norm_backward, norm_forward  # noqa: F401
