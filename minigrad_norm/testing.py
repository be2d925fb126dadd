"""Hypothesis strategies for gradient tests (needs the ``test`` extra).

The project's own tests use these; they are public so that a user can test
an op of their own the same way::

    from hypothesis import given, strategies as st
    from minigrad_norm.testing import arrays, broadcastable_shapes

    @given(broadcastable_shapes().flatmap(lambda s: st.tuples(arrays(s[0]), arrays(s[1]))))
    def test_my_op(xy): ...

"Well conditioned" means what finite differences need: float64 values of
moderate size, optionally kept ``margin`` away from zero (for ops with a kink
there, like relu) or at least ``min_gap`` apart (for max and sorting, where
a near-tie would move under a perturbation of eps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

try:
    import hypothesis.extra.numpy as hnp
    from hypothesis import strategies as st
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("minigrad_norm.testing needs hypothesis: pip install 'minigrad_norm[test]'") from e

Shape = tuple[int, ...]


def shapes(min_dims: int = 0, max_dims: int = 4, min_side: int = 1, max_side: int = 5) -> st.SearchStrategy[Shape]:
    """Array shapes, including scalars () when ``min_dims`` is 0 and size-1 dims."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable_shapes(
    num_shapes: int = 2, min_dims: int = 0, max_dims: int = 4, max_side: int = 4, min_side: int = 1
) -> st.SearchStrategy[tuple[Shape, ...]]:
    """Tuples of shapes that broadcast together, e.g. ((3, 1, 4), (2, 4)) or ((), (2,)); ``min_side=0``
    draws zero-size dims too (a 0 broadcasts against 1 and 0 only)."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    ).map(lambda r: r.input_shapes)


def axes(ndim: int) -> st.SearchStrategy[int | tuple[int, ...] | None]:
    """A reduction ``axis`` argument for an array of ``ndim`` dims: None, an int (maybe negative) or a tuple."""
    if ndim == 0:
        return st.sampled_from([None, (), 0, -1])
    return st.one_of(
        st.none(),
        st.integers(-ndim, ndim - 1),
        hnp.valid_tuple_axes(ndim, min_size=1),
    )


def arrays(
    shape: Shape | st.SearchStrategy[Shape],
    dtype: np.dtype | type = np.float64,
    *,
    low: float = -2.0,
    high: float = 2.0,
    margin: float = 0.0,
    min_gap: float = 0.0,
) -> st.SearchStrategy[np.ndarray]:
    """Float arrays with values in [low, high].

    ``margin`` keeps every value at least that far from 0; ``min_gap`` makes
    all values pairwise at least that far apart (values then lie on a grid of
    that spacing, shifted by a random offset, with the interval (-margin,
    margin) cut out). Both hold exactly for the returned values, in their
    dtype. A range too narrow for them is a ValueError: when the strategy is
    built for a fixed ``shape``, when a shape is drawn for a strategy of shapes.
    """
    dtype = np.dtype(dtype)
    if min_gap > 0:
        return _gap_arrays(shape, dtype, low, high, margin, min_gap)
    # with a margin, drawn from [low, -margin] and [margin, high] directly: a filter would reject too often
    sides = [(max(low, margin), high), (low, min(high, -margin))] if margin > 0 else [(low, high)]
    pieces = [p for p in (_floats_between(a, b, dtype) for a, b in sides) if p is not None]
    if not pieces:
        away = f" is at least {margin} away from 0 (margin)" if margin > 0 else ""
        raise ValueError(f"arrays: no {dtype} value in [{low}, {high}]{away}")
    return hnp.arrays(dtype, shape, elements=st.one_of(*pieces))


def _floats_between(a: float, b: float, dtype: np.dtype) -> st.SearchStrategy[float] | None:
    """Floats exactly representable in ``dtype`` within [a, b] (None if there is none): a float64 value
    would be rounded by the cast to a narrower dtype, possibly past a bound."""
    real = np.finfo(dtype).dtype  # (the parts' dtype, for a complex one)
    lo, hi = real.type(a), real.type(b)
    # compared as Python floats: NumPy would compare a float32 with a Python float in float32
    lo = float(lo if float(lo) >= a else np.nextafter(lo, real.type(np.inf)))
    hi = float(hi if float(hi) <= b else np.nextafter(hi, real.type(-np.inf)))
    if not lo <= hi:
        return None
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=8 * real.itemsize)


def _gap_arrays(
    shape: Shape | st.SearchStrategy[Shape], dtype: np.dtype, low: float, high: float, margin: float, min_gap: float
) -> st.SearchStrategy[np.ndarray]:
    """``arrays`` with ``min_gap > 0``: distinct grid points of the allowed set [low, -margin] u [margin, high].

    The allowed pieces are laid end to end on a line u in [0, total]; u = (i + offset) * gap, i distinct
    integers in 0..k, offset in [0, 1/2], is mapped back piece by piece. That map moves points apart
    (by the cut-out width) and never closer, so grid points gap apart stay gap apart, and no point lands in
    (-margin, margin). Each value is computed with an error below ``slack`` (a few roundings of numbers
    at most ``scale``, then one to ``dtype``), so building with margin + slack, gap + 2 * slack and
    [low + slack, high - slack] keeps every guarantee exact after rounding.
    """
    scale = max(abs(low), abs(high), high - low)
    slack = 8 * scale * float(np.finfo(dtype).eps)
    lo, hi, cut, gap = low + slack, high - slack, margin + slack, min_gap + 2 * slack
    sides = [(lo, min(hi, -cut)), (max(lo, cut), hi)] if margin > 0 else [(lo, hi)]
    starts = np.array([a for a, b in sides if a <= b])
    lengths = np.array([b - a for a, b in sides if a <= b])
    offsets = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))  # where each piece starts on the line u
    # (k + 1/2) * gap <= total; 1e-9 keeps a point that would land on the end from being rounded past it
    k = math.floor(lengths.sum() / gap - 0.5 - 1e-9) if lengths.size else -1
    values = f"values {min_gap} apart (min_gap)" + (f" and {margin} away from 0 (margin)" if margin > 0 else "")
    if k < 0:
        raise ValueError(f"arrays: [{low}, {high}] is too narrow for {values}")

    def fits(s: Shape) -> Shape:
        if math.prod(s) > k + 1:
            raise ValueError(
                f"arrays: [{low}, {high}] holds at most {k + 1} {values}, fewer than the {math.prod(s)} of shape {s}"
            )
        return s

    shape = shape.map(fits) if isinstance(shape, st.SearchStrategy) else fits(shape)

    def place(t: tuple[np.ndarray, float]) -> np.ndarray:
        u = (t[0] + t[1]) * gap
        piece = np.searchsorted(offsets, u, side="right") - 1
        return (starts[piece] + (u - offsets[piece])).astype(dtype)

    grid = hnp.arrays(np.int64, shape, elements=st.integers(0, k), unique=True)
    return st.tuples(grid, st.floats(0, 0.5)).map(place)


def dtypes(choices: Sequence[type] = (np.float32, np.float64)) -> st.SearchStrategy[np.dtype]:
    """One of ``choices`` as a NumPy dtype; ``arrays`` takes a dtype, not a strategy: draw it first
    (``dtypes().flatmap(lambda d: arrays((3,), d))``)."""
    return st.sampled_from([np.dtype(d) for d in choices])


# -- normalization layers -----------------------------------------------------------------------------
def ensure_spread(
    a: np.ndarray, axes: int | Sequence[int], min_std: float = 0.2, mask: np.ndarray | None = None
) -> np.ndarray:
    """A copy of ``a`` in which every group (the values sharing an index outside ``axes``) has std >= min_std.

    A group below it gets a centered ramp of std 2 * min_std added; since the
    standard deviation is a norm on centered vectors, the sum then has a
    spread of at least min_std. ``mask`` (broadcastable to ``a``) restricts the
    groups to their valid values; groups with fewer than 2 values are left alone.
    """
    try:  # (not ``ax % a.ndim``: it wraps an axis out of range around, and divides by 0 for a 0-d array)
        axes = normalize_axis_tuple(axes, a.ndim)
    except ValueError as e:  # AxisError, or an axis repeated
        raise ValueError(f"ensure_spread: axes={axes!r} for an array of shape {a.shape}: {e}") from None
    keep = [ax for ax in range(a.ndim) if ax not in axes]
    order = keep + list(axes)
    moved = np.array(np.transpose(a, order), order="C", copy=True)  # rows below are views of it
    rows = moved.reshape(-1, int(np.prod([a.shape[ax] for ax in axes], dtype=np.int64)))
    valid = (
        np.ones(rows.shape, bool)
        if mask is None
        else np.transpose(np.broadcast_to(mask, a.shape), order).reshape(rows.shape)
    )
    for row, ok in zip(rows, valid):
        m = int(ok.sum())
        if m >= 2 and row[ok].std() < min_std:
            ramp = np.linspace(-1.0, 1.0, m)
            row[ok] += ramp * (2 * min_std / ramp.std())
    return np.transpose(rows.reshape(moved.shape), np.argsort(order))


def spread_arrays(
    shape: Shape, axes: int | Sequence[int], dtype: np.dtype | type = np.float64, *, min_std: float = 0.2
) -> st.SearchStrategy[np.ndarray]:
    """Arrays in [-2, 2] (plus a ramp where needed) whose groups over ``axes`` have std >= min_std:
    well conditioned for the finite differences of a norm whose statistics reduce over ``axes``."""
    return arrays(shape, dtype).map(lambda a: ensure_spread(a, axes, min_std))


def channel_shapes(
    max_spatial_dims: int = 2, min_batch: int = 1, max_side: int = 4, min_spatial: int = 1
) -> st.SearchStrategy[Shape]:
    """(N, C, *spatial) shapes with 0..max_spatial_dims spatial dims whose product is >= min_spatial."""
    return (
        st.tuples(
            st.integers(min_batch, max_side),
            st.integers(1, max_side),
            st.lists(st.integers(1, max_side), max_size=max_spatial_dims),
        )
        .map(lambda t: (t[0], t[1], *t[2]))
        .filter(lambda s: int(np.prod(s[2:], dtype=np.int64)) >= min_spatial)
    )


def layer_norm_shapes(
    max_lead_dims: int = 2, max_norm_dims: int = 2, max_side: int = 4, min_group: int = 1
) -> st.SearchStrategy[tuple[Shape, Shape]]:
    """(x_shape, normalized_shape): normalized_shape the trailing 1..max_norm_dims dims of x_shape,
    with at least ``min_group`` elements (a group of one value has a zero Jacobian)."""
    norm = shapes(1, max_norm_dims, 1, max_side).filter(lambda s: int(np.prod(s)) >= min_group)
    return st.tuples(shapes(0, max_lead_dims, 1, max_side), norm).map(lambda t: (t[0] + t[1], t[1]))


def masks(shape: Shape, min_valid: int = 2) -> st.SearchStrategy[np.ndarray]:
    """Boolean masks of ``shape`` (N, *spatial) with at least ``min_valid`` True values in each sample.

    A sample of fewer than ``min_valid`` positions cannot have them: ValueError.
    """
    if len(shape) < 1 or min_valid > math.prod(shape[1:]):
        raise ValueError(
            f"masks: min_valid={min_valid} True values per sample need a shape (N, *spatial) with at least as "
            f"many positions per sample, got {shape}"
        )

    def at_least(m: np.ndarray) -> np.ndarray:
        rows = m.reshape(m.shape[0], -1)
        for row in rows:
            if row.sum() < min_valid:
                row[:min_valid] = True
        return rows.reshape(m.shape)

    return hnp.arrays(np.bool_, shape).map(lambda m: at_least(m.copy()))
