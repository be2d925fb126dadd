"""The closed-form Jacobians refuse what their norms refuse, with the same error.

Each case calls ``minigrad_norm.jacobians.<norm>`` and the forward
``minigrad_norm.norms.<norm>`` with the same keyword arguments: both must
raise the same class, with a message naming the function (``<norm>_jacobian``
or ``<norm>``) and the argument at fault. Before these checks the Jacobians
returned NaN (no running statistics, a negative eps), flattened a weight of
the wrong shape, or failed with a bare unpack/reshape/ufunc error. That the
closed forms equal reverse mode for valid input is tested in
``test_norms_gradients.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from minigrad_norm import jacobians, norms

X = np.random.default_rng(0).standard_normal((2, 3, 4))  # (N, C, S), also rows of D = 4
RUNNING = {"running_mean": np.zeros(3), "running_var": np.ones(3)}

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
    # statistics held constant need both running buffers
    ("batch_norm", (X,), {"training": False}, ValueError, r"running_mean and running_var are required when training"),
    (
        "instance_norm",
        (X,),
        {"use_input_stats": False},
        ValueError,
        r"running_mean and running_var are required when use_input_stats=False",
    ),
    (
        "batch_norm",
        (X,),
        {"training": False, "running_mean": np.zeros(3)},
        ValueError,
        r"running_mean and running_var must either both be None or neither be None, got only running_mean",
    ),
    (
        "batch_norm",
        (X,),
        {"training": False, "running_mean": np.zeros(4), "running_var": np.ones(4)},
        ValueError,
        r"running_mean must have shape \(3,\) \(one per channel\), got \(4,\)",
    ),
    (
        "instance_norm",
        (X,),
        {"use_input_stats": False, "running_mean": np.zeros(3), "running_var": np.ones(3, dtype=np.int64)},
        TypeError,
        r"running_var must be a float ndarray of shape \(3,\)",
    ),
    # the switch between batch and running statistics: "False" would be true
    ("batch_norm", (X,), {"training": "False", **RUNNING}, TypeError, r"training must be a bool, got str 'False'"),
    ("instance_norm", (X,), {"use_input_stats": 0}, TypeError, r"use_input_stats must be a bool, got int 0"),
    # eps: a finite number, > 0 for the channel norms, >= 0 for layer_norm and rms_norm (as in their forwards)
    ("layer_norm", (X, 4), {"eps": -10.0}, ValueError, r"eps must be a finite number >= 0, got -10.0"),
    ("layer_norm", (X, 4), {"eps": "1e-5"}, TypeError, r"eps must be a real number, got '1e-5'"),
    ("rms_norm", (X, 4), {"eps": float("nan")}, ValueError, r"eps must be a finite number >= 0, got nan"),
    ("group_norm", (X, 3), {"eps": 0.0}, ValueError, r"eps must be a finite number > 0, got 0.0"),
    ("batch_norm", (X,), {"eps": -1e-5, **RUNNING}, ValueError, r"eps must be a finite number > 0"),
    ("instance_norm", (X,), {"eps": "1e-5"}, TypeError, r"eps must be a real number, got '1e-5'"),
    # weight of the wrong shape, even with the right number of elements
    (
        "layer_norm",
        (X, 4),
        {"weight": np.ones((2, 2))},
        ValueError,
        r"weight must have shape \(4,\) for an input of shape \(2, 3, 4\), got \(2, 2\)",
    ),
    ("rms_norm", (X, 4), {"weight": np.ones((2, 2))}, ValueError, r"weight must have shape \(4,\) .* got \(2, 2\)"),
    ("batch_norm", (X,), {"weight": np.ones(4), **RUNNING}, ValueError, r"weight must have shape \(3,\) .* got \(4,\)"),
    ("instance_norm", (X,), {"weight": np.ones((3, 1))}, ValueError, r"weight must have shape \(3,\) .* \(3, 1\)"),
    ("group_norm", (X, 3), {"weight": np.ones(4)}, ValueError, r"weight must have shape \(3,\) .* got \(4,\)"),
    # input: floating point, (N, C, *) for the channel norms
    ("layer_norm", (X.astype(np.int64), 4), {}, TypeError, r"input must be a floating-point array, got dtype int64"),
    ("batch_norm", (np.ones(4),), {}, ValueError, r"input must have at least 2 dims \(N, C, \*\), got shape \(4,\)"),
    ("instance_norm", (np.ones(4),), {}, ValueError, r"input must have at least 2 dims \(N, C, \*\), got shape \(4,\)"),
    ("group_norm", (np.ones(4), 1), {}, ValueError, r"input must have at least 2 dims \(N, C, \*\), got shape \(4,\)"),
    ("group_norm", (X, 2), {}, ValueError, r"num_groups=2 must be positive and divide the number of channels C=3"),
    # mask: boolean, (N, *spatial)
    (
        "batch_norm",
        (X,),
        {"training": True, "mask": np.ones((2, 5), dtype=bool)},
        ValueError,
        r"mask must have shape \(N, \*spatial\) = \(2, 4\) for an input of shape \(2, 3, 4\), got \(2, 5\)",
    ),
    ("instance_norm", (X,), {"mask": np.ones((2, 4), int)}, TypeError, r"mask must be a boolean array .* dtype int64"),
    # a statistic of one value (NaN from 0/0 under a mask that leaves none)
    ("instance_norm", (X[:, :, :1],), {}, ValueError, r"Expected more than 1 spatial element when training"),
    (
        "batch_norm",
        (X,),
        {"training": True, "mask": np.zeros((2, 4), dtype=bool)},
        ValueError,
        r"Expected more than 1 value per channel when training, .* \(the mask leaves 0 valid value",
    ),
    ("group_norm", (np.ones((1, 2)), 2), {}, ValueError, r"Expected more than 1 value per channel when training"),
]


@pytest.mark.parametrize(("norm", "args", "kwargs", "error", "message"), CASES)
def test_jacobian_refuses_what_the_forward_refuses(
    norm: str, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=rf"^{norm}_jacobian: {message}"):
        getattr(jacobians, norm)(*args, **kwargs)
    forward_defaults = {"running_mean": None, "running_var": None} if norm == "batch_norm" else {}  # (required)
    with pytest.raises(error, match=rf"^{norm}: {message}"):
        getattr(norms, norm)(*args, **{**forward_defaults, **kwargs})


def test_jacobians_take_what_the_forwards_take() -> None:
    """The checks let through the inputs the forwards accept: Tensors, eps = 0 where the forward allows it,
    rms_norm's eps=None. Each Jacobian is then one block per group, of the group's size."""
    from minigrad_norm.tensor import Tensor

    w3, w4 = Tensor(np.ones(3)), Tensor(np.ones(4))
    assert jacobians.layer_norm(Tensor(X), 4, w4, eps=0.0).shape == (6, 4, 4)
    assert jacobians.rms_norm(X, 4, w4, eps=None).shape == (6, 4, 4)
    assert jacobians.batch_norm(Tensor(X), w3, training=False, **RUNNING).shape == (3, 8, 8)
    assert jacobians.instance_norm(X, w3, mask=np.ones((2, 4), dtype=bool)).shape == (6, 4, 4)
    assert jacobians.group_norm(X, 1, w3).shape == (2, 12, 12)
