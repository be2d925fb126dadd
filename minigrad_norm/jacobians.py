"""Closed-form Jacobians of the normalization layers, one matrix per normalized group.

Each function returns an array of shape (groups, m, m): the Jacobian of a
group's m outputs with respect to the same group's m inputs (outputs of one
group do not depend on the inputs of another). For a group with
rstd = 1 / sqrt(var + eps) and normalized values xhat:

    centered (LayerNorm, GroupNorm, InstanceNorm, training BatchNorm):
        J = diag(gamma) * rstd * (I - 1/m * 1 1^T - 1/m * xhat xhat^T)
    RMSNorm (no centering):
        J = diag(gamma) * rstd * (I - 1/m * xhat xhat^T)
    statistics held constant (eval-mode BatchNorm, InstanceNorm without input stats):
        J = diag(gamma) * rstd * I

The groups: a row of normalized_shape (layer_norm, rms_norm), a (sample,
group) (group_norm), a (sample, channel) (instance_norm), a channel across the
batch (batch_norm). Each function is defined, with its derivation, next to
its norm in ``minigrad_norm.norms``; all of them compute the matrices with one
function, ``minigrad_norm.norms._jacobian.group_jacobians``.
"""

from minigrad_norm.norms.batch_norm import batch_norm_jacobian as batch_norm
from minigrad_norm.norms.group_norm import group_norm_jacobian as group_norm
from minigrad_norm.norms.instance_norm import instance_norm_jacobian as instance_norm
from minigrad_norm.norms.layer_norm import layer_norm_jacobian as layer_norm
from minigrad_norm.norms.rms_norm import rms_norm_jacobian as rms_norm

__all__ = ["batch_norm", "group_norm", "instance_norm", "layer_norm", "rms_norm"]
