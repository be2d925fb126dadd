"""The hypothesis strategies of ``minigrad_norm.testing`` give what their docstrings promise.

Each guarantee is asserted exactly (no tolerance) on the drawn values, read as
float64: the range [low, high], ``margin`` from 0, ``min_gap`` between any two
values, ``min_valid`` True values per sample of a mask; and arguments that no
draw could satisfy are a ValueError naming the strategy.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import find, given
from hypothesis import strategies as st

from minigrad_norm.testing import (
    arrays,
    broadcastable_shapes,
    channel_shapes,
    ensure_spread,
    layer_norm_shapes,
    masks,
    spread_arrays,
)


def _pairwise_gap(a: np.ndarray) -> float:
    """The smallest distance between two values (inf for fewer than two)."""
    flat = np.sort(a.astype(np.float64).ravel())
    return float(np.diff(flat).min()) if flat.size > 1 else math.inf


# -- arrays ------------------------------------------------------------------------------------------
@given(data=st.data())
def test_arrays_stay_in_range_with_margin_and_min_gap_in_both_dtypes(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    low, high = data.draw(st.sampled_from([-2.0, -1.0])), data.draw(st.sampled_from([1.0, 2.0]))
    margin = data.draw(st.sampled_from([0.0, 0.1, 0.5]))
    min_gap = data.draw(st.sampled_from([0.0, 0.1, 0.3, 1 / 3]))
    # the narrowest allowed set, [-1, -0.5] u [0.5, 1], holds 3 values 1/3 apart
    shape = data.draw(st.sampled_from([(), (1,), (3,), (1, 3)]))
    a = data.draw(arrays(shape, dtype, low=low, high=high, margin=margin, min_gap=min_gap))
    v = a.astype(np.float64)
    assert a.dtype == dtype and a.shape == shape
    assert np.all((low <= v) & (v <= high))
    assert np.all(np.abs(v) >= margin)
    assert _pairwise_gap(a) >= min_gap


@given(arrays((20,), margin=0.5, min_gap=0.1))
def test_arrays_keep_the_margin_when_a_min_gap_is_asked_for_too(a: np.ndarray) -> None:
    # 20 values 0.1 apart in [-2, -0.5] u [0.5, 2] (room for 30): with margin ignored, about a quarter of
    # them would land inside (-0.5, 0.5)
    assert np.abs(a).min() >= 0.5
    assert _pairwise_gap(a) >= 0.1


@given(arrays((40,), min_gap=0.1))
def test_arrays_min_gap_holds_exactly_between_grid_neighbours(a: np.ndarray) -> None:
    # [-2, 2] holds 40 values 0.1 apart: this draw is the whole grid, so every pair of neighbours is compared.
    # -2 + (i + 1) * 0.1 - (-2 + i * 0.1) rounds below 0.1 for i = 1, 3, 7, ...: the gap must not depend on it
    assert _pairwise_gap(a) >= 0.1
    assert -2.0 <= a.min() and a.max() <= 2.0


@given(arrays((4,), np.float32, low=-0.7, high=2.3, margin=0.7))
def test_float32_arrays_keep_range_and_margin_after_the_cast(a: np.ndarray) -> None:
    # float32(0.7) is 0.699999988...: a float64 value of 0.7 cast to float32 would be inside the margin
    v = a.astype(np.float64)
    assert np.abs(v).min() >= 0.7 and v.max() <= 2.3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"low": 0.0, "high": 0.1, "min_gap": 0.5}, r"arrays: \[0.0, 0.1\] is too narrow for values 0.5 apart"),
        ({"low": -0.2, "high": 0.2, "margin": 0.3}, r"arrays: no float64 value in \[-0.2, 0.2\] is at least 0.3"),
        ({"low": 1.0, "high": 0.0}, r"arrays: no float64 value in \[1.0, 0.0\]"),
        ({"low": -0.5, "high": 0.5, "margin": 0.5, "min_gap": 0.1}, r"arrays: \[-0.5, 0.5\] is too narrow"),
    ],
)
def test_arrays_refuse_a_range_without_room(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arrays((2,), **kwargs)


def test_arrays_refuse_more_values_than_the_min_gap_leaves_room_for() -> None:
    # [-2, 2] holds 8 values 0.5 apart (offset up to half a gap): 10 cannot be drawn
    with pytest.raises(ValueError, match=r"arrays: \[-2.0, 2.0\] holds at most 8 values 0.5 apart .* 10 of shape"):
        arrays((10,), min_gap=0.5)


def test_arrays_refuse_a_drawn_shape_with_more_values_than_room() -> None:
    @given(arrays(st.just((10,)), min_gap=0.5))
    def draw(a: np.ndarray) -> None:
        pass

    with pytest.raises(ValueError, match=r"arrays: .* holds at most 8 values"):
        draw()


# -- masks -------------------------------------------------------------------------------------------
@given(data=st.data())
def test_masks_have_min_valid_true_values_per_sample(data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from([(3,), (2, 1), (2, 4), (3, 2, 3)]))
    min_valid = data.draw(st.integers(0, math.prod(shape[1:])))
    m = data.draw(masks(shape, min_valid))
    assert m.dtype == np.bool_ and m.shape == shape
    assert np.all(m.reshape(shape[0], -1).sum(axis=1) >= min_valid)


@pytest.mark.parametrize(("shape", "min_valid"), [((2, 1), 2), ((3, 2, 2), 5), ((), 0)])
def test_masks_refuse_samples_smaller_than_min_valid(shape: tuple[int, ...], min_valid: int) -> None:
    with pytest.raises(ValueError, match=rf"masks: min_valid={min_valid} .* got {re.escape(str(shape))}"):
        masks(shape, min_valid)


# -- ensure_spread / spread_arrays -------------------------------------------------------------------
@given(data=st.data())
def test_spread_arrays_groups_have_at_least_min_std(data: st.DataObject) -> None:
    shape, axes = data.draw(st.sampled_from([((3, 4), 1), ((3, 4), (0, 1)), ((2, 3, 2), (0, 2)), ((5,), -1)]))
    a = data.draw(spread_arrays(shape, axes, min_std=0.2))
    # the ramp added gives std >= 2 * 0.2 - std(before) > 0.2 by the triangle inequality; the bound is
    # strict, so only a group just under 0.2 could end a few ulps below it: 1e-12 of slack
    assert np.all(a.std(axis=axes) >= 0.2 - 1e-12)


@pytest.mark.parametrize(
    ("shape", "axes", "match"),
    [
        ((), 0, r"ensure_spread: axes=0 for an array of shape \(\): axis 0 is out of bounds"),
        ((3,), 1, r"ensure_spread: axes=1 for an array of shape \(3,\): axis 1 is out of bounds"),
        ((3, 2), (0, -2), r"ensure_spread: axes=\(0, -2\) for an array of shape \(3, 2\): repeated axis"),
    ],
)
def test_ensure_spread_refuses_axes_the_array_does_not_have(
    shape: tuple[int, ...], axes: int | tuple[int, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ensure_spread(np.ones(shape), axes)


# -- shapes ------------------------------------------------------------------------------------------
def test_shape_strategies_draw_their_smallest_allowed_case() -> None:
    """The degenerate cases they promise are drawn (``find`` fails when no example is): the smallest group
    of a LayerNorm, no spatial dims, the smallest map."""
    for min_group in (1, 2, 3):
        find(layer_norm_shapes(min_group=min_group), lambda t, m=min_group: math.prod(t[1]) == m)
    find(channel_shapes(), lambda s: len(s) == 2)
    for min_spatial in (2, 4):
        find(channel_shapes(min_spatial=min_spatial), lambda s, m=min_spatial: math.prod(s[2:]) == m)


@given(data=st.data())
def test_shape_strategies_never_go_below_their_minimum(data: st.DataObject) -> None:
    min_group, min_spatial = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    x_shape, normalized = data.draw(layer_norm_shapes(min_group=min_group))
    assert x_shape[len(x_shape) - len(normalized) :] == normalized and math.prod(normalized) >= min_group
    assert math.prod(data.draw(channel_shapes(min_spatial=min_spatial))[2:]) >= min_spatial


def test_broadcastable_shapes_draw_zero_size_dims_only_when_asked() -> None:
    find(broadcastable_shapes(min_side=0), lambda t: any(0 in s for s in t) and len(set(t)) > 1)


@given(shapes=broadcastable_shapes(num_shapes=3), zero_ok=broadcastable_shapes(min_side=0))
def test_broadcastable_shapes_broadcast(shapes, zero_ok) -> None:
    np.broadcast_shapes(*shapes)
    np.broadcast_shapes(*zero_ok)
    assert all(0 not in s for s in shapes)
