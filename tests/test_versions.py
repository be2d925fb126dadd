"""Version counters: a backward refuses a saved array that was written in place after its forward.

Without them, an optimizer step between a forward and its backward gave the gradient at the new weights,
with no error. The expected gradients here are closed forms; the PyTorch cases check that both engines
raise, or both do not, on the same program.
"""

import gc

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import event, given
from numpy.lib.stride_tricks import sliding_window_view

import minigrad_norm as mg
import minigrad_norm.functional as F
from minigrad_norm import Function, Tensor, increment_version, nn
from minigrad_norm.nn import Module, Parameter
from minigrad_norm.optim import SGD, Adam, AdamW
from minigrad_norm.tensor import _versions

OPTIMIZERS = {"sgd": lambda ps: SGD(ps, lr=0.1), "adam": lambda ps: Adam(ps, lr=0.1), "adamw": lambda ps: AdamW(ps)}


def leaf(a, dtype=np.float64):
    return Tensor(np.asarray(a, dtype=dtype), requires_grad=True)


def step(make_optimizer, params):
    for p in params:
        p.grad = np.ones_like(p.data)
    make_optimizer(params).step()


def linear_graph():
    lin = nn.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(0))
    x = leaf(np.random.default_rng(1).normal(size=(4, 3)))
    return (lin(x) ** 2).sum(), [lin.weight, lin.bias], "Linear"


def layer_norm_graph():
    ln = nn.LayerNorm(5, dtype=np.float64)
    x = leaf(np.random.default_rng(2).normal(size=(3, 5)))
    return (ln(x) * Tensor(np.arange(5.0))).sum(), [ln.weight, ln.bias], "Normalize"


def matmul_graph():
    w = leaf(np.random.default_rng(3).normal(size=(3, 3)))
    x = leaf(np.ones((2, 3)))
    return ((x @ w) ** 2).sum(), [w], "MatMul"


def row_view_graph():
    # the row is a new Tensor whose array is a view of w's: the write to w must reach it
    w = leaf(np.arange(6.0).reshape(2, 3))
    row = w[1]
    return (row * row).sum(), [w], "Mul"


GRAPHS = [linear_graph, layer_norm_graph, matmul_graph, row_view_graph]


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.__name__)
def test_an_optimizer_step_between_forward_and_backward_is_refused(graph, make_optimizer):
    loss, params, op = graph()
    step(make_optimizer, params)
    with pytest.raises(RuntimeError, match=rf"{op}\.backward: saved array \d .* modified in place.*version 1"):
        loss.backward()


def test_the_usual_order_and_a_forward_after_the_step_are_unaffected():
    w = leaf([1.0, -2.0, 3.0])
    (w * w).sum().backward()  # forward, backward, step: nothing is refused
    np.testing.assert_array_equal(w.grad, [2.0, -4.0, 6.0])
    SGD([w], lr=0.25).step()  # w = w - 0.25 * 2w = w / 2
    w.grad = None
    (w * w).sum().backward()  # a forward after the step saves the new version
    np.testing.assert_array_equal(w.grad, [1.0, -2.0, 3.0])
    assert w._version == 1


def test_an_op_that_saved_nothing_of_the_parameter_still_gives_its_gradient():
    # add saves nothing, and its gradient does not depend on the values: PyTorch does not raise either
    w, x = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    loss = ((w + x) * Tensor(np.array([5.0, 7.0]))).sum()
    step(OPTIMIZERS["sgd"], [w])
    w.grad = None
    loss.backward()
    np.testing.assert_array_equal(w.grad, [5.0, 7.0])
    np.testing.assert_array_equal(x.grad, [5.0, 7.0])


def test_load_state_dict_between_forward_and_backward_is_refused():
    lin = nn.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(0))
    loss = (lin(leaf(np.ones((2, 3)))) ** 2).sum()
    lin.load_state_dict({k: v + 1.0 for k, v in lin.state_dict().items()})
    with pytest.raises(RuntimeError, match="Linear.backward: .*modified in place"):
        loss.backward()


def test_a_retained_graph_is_refused_after_a_step():
    w = leaf([1.0, 2.0])
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    SGD([w], lr=0.1).step()
    with pytest.raises(RuntimeError, match="Mul.backward: .*version 1, the forward saved version 0"):
        loss.backward()


def test_increment_version_is_public_counts_per_owner_and_reaches_every_view():
    x = leaf(np.arange(6.0).reshape(2, 3))
    r = x.reshape(3, 2)
    y = r * r  # saves r, a view of x's array
    assert x._version == 0
    mg.increment_version(x.data[0])  # a write through another view of the same memory
    assert x._version == 1 and y._version == 0  # y's array is its own
    with pytest.raises(RuntimeError, match=r"Mul.backward: saved array 0 \(shape \(3, 2\), float64\)"):
        y.sum().backward()
    increment_version(x)
    assert x._version == 2


def test_the_count_of_an_array_is_dropped_with_the_array():
    before = len(_versions)
    a = np.ones(3)
    increment_version(a[1:])
    assert len(_versions) == before + 1
    del a
    gc.collect()
    assert len(_versions) == before


def test_increment_version_takes_a_list_and_refuses_what_is_not_an_array():
    a, b = leaf([1.0]), np.ones(2)
    increment_version([a, b])
    assert a._version == 1 and Tensor(b)._version == 1
    for bad in (None, 1.0, np.float64(1.0), "w"):
        with pytest.raises(TypeError, match=f"increment_version: expected a Tensor, .* got {type(bad).__name__}"):
            increment_version(bad)


class NeighbourProducts(Function):
    """y[i] = a[i] a[i + 1], saving a sliding-window view of a (as_strided: its base is not an ndarray)."""

    @staticmethod
    def forward(ctx, a):
        w = sliding_window_view(a, 2)
        ctx.save_for_backward(w)
        return w[:, 0] * w[:, 1]

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        d = np.zeros(len(w) + 1)
        d[:-1] += g * w[:, 1]
        d[1:] += g * w[:, 0]
        return d


def test_a_strided_view_reaches_the_count_of_its_array():
    a = leaf([1.0, 2.0, 3.0])
    loss = NeighbourProducts.apply(a).sum()
    step(OPTIMIZERS["sgd"], [a])
    with pytest.raises(RuntimeError, match="NeighbourProducts.backward: saved array 0 .* modified in place"):
        loss.backward()


class Permutation(Module):
    def __init__(self):
        super().__init__()
        self.w = Parameter(np.array([1.0, 2.0, 3.0]))
        self.register_buffer("perm", np.array([0, 1, 2]))

    def forward(self):
        return self.w[self.perm]


def test_an_index_written_after_the_forward_does_not_move_the_gradient():
    # the forward copies its index arrays: the gradient goes where the forward read (PyTorch raises instead)
    m = Permutation()
    loss = (m() * Tensor(np.array([1.0, 10.0, 100.0]))).sum()
    m.load_state_dict({"perm": np.array([2, 1, 0])}, strict=False)
    loss.backward()
    np.testing.assert_array_equal(m.w.grad, [1.0, 10.0, 100.0])
    x, mask = leaf([1.0, 2.0, 3.0]), np.array([True, False, True])
    loss = x[mask].sum()
    mask[...] = [False, True, False]
    loss.backward()
    np.testing.assert_array_equal(x.grad, [1.0, 0.0, 1.0])
    table, tokens = leaf(np.zeros((3, 2))), np.array([0])  # an embedding's indices too
    y = F.embedding(tokens, table)
    tokens[0] = 2
    y.sum().backward()
    np.testing.assert_array_equal(table.grad.sum(axis=1), [2.0, 0.0, 0.0])
    w, rows = leaf([1.0, 2.0, 3.0]), [0, 0]  # a list too (no write to it can be counted)
    y = w[rows]
    rows[1] = 2
    y.backward(np.array([1.0, 10.0]))
    np.testing.assert_array_equal(w.grad, [11.0, 0.0, 0.0])


def test_a_norm_mask_written_after_the_forward_does_not_change_the_gradient():
    rng = np.random.default_rng(5)
    x, c = leaf(rng.normal(size=(1, 2, 6))), Tensor(rng.normal(size=(1, 2, 6)))
    mask = np.array([[True] * 4 + [False] * 2])
    loss = (F.instance_norm(x, mask=mask) * c).sum()
    expected = mg.grad(loss, x, retain_graph=True)[0]
    assert np.all(expected[..., 4:] == 0) and np.all(expected[..., :4] != 0)
    mask[0, 4:] = True
    increment_version(mask)
    loss.backward()
    np.testing.assert_array_equal(x.grad, expected)


def test_resetting_the_running_statistics_is_counted():
    bn = nn.BatchNorm1d(3, dtype=np.float64)
    bn.running_mean[...] = [1.0, 2.0, 3.0]
    w = leaf(np.ones(3))
    loss = (w * Tensor(bn.running_mean)).sum()  # a Tensor sharing the buffer
    bn.reset_running_stats()
    with pytest.raises(RuntimeError, match="Mul.backward: saved array 1 .* modified in place"):
        loss.backward()


def test_grad_runs_only_the_ops_on_a_path_to_its_inputs():
    # as torch.autograd.grad: w's op is off the path to x, so its written saved array does not matter
    w, x = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    loss = (w * w).sum() + (x * x).sum()
    step(OPTIMIZERS["sgd"], [w])
    (dx,) = mg.grad(loss, x)
    np.testing.assert_array_equal(dx, [6.0, 8.0])
    with pytest.raises(RuntimeError, match="Mul.backward: .*modified in place"):
        mg.grad(loss, w)
    # the root itself off every path: its backward does not run either, and the gradient is zero
    z = leaf([5.0, 6.0])
    y = w * z
    step(OPTIMIZERS["sgd"], [w, z])
    (dx,) = mg.grad(y, [x], np.ones(2))
    np.testing.assert_array_equal(dx, [0.0, 0.0])


class Float64Gradient(Function):
    """y = 2 x, whose backward returns float64 whatever x's dtype."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return (2 * g).astype(np.float64)


class RecordsGradientDtype(Function):
    """y = x, recording the dtype of the gradient that reaches it."""

    seen: list = []

    @staticmethod
    def forward(ctx, x):
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        RecordsGradientDtype.seen.append(g.dtype)
        return g


def test_each_gradient_is_cast_to_its_input_s_dtype_as_in_pytorch():
    x = leaf([1.0, 2.0], dtype=np.float32)
    h = RecordsGradientDtype.apply(x)
    Float64Gradient.apply(h).sum().backward()
    assert RecordsGradientDtype.seen == [np.dtype(np.float32)]
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])
    # a float64 gradient given for a float32 root reaches its backward as float32, as in PyTorch
    RecordsGradientDtype.seen.clear()
    (dx,) = mg.grad(RecordsGradientDtype.apply(x), [x], np.ones(2))
    RecordsGradientDtype.apply(x).backward(np.ones(2))
    assert RecordsGradientDtype.seen == [np.dtype(np.float32)] * 2 and dx.dtype == np.float32


# -- the same programs in PyTorch: forward, an SGD step on w, backward -------------------------------
PROGRAMS = {  # name: (ours, torch's), each f(w, x) -> a scalar loss; w[:2] is a view of w in both
    "linear": (lambda w, x: (F.linear(x, w) ** 2).sum(), lambda w, x, t: (t.nn.functional.linear(x, w) ** 2).sum()),
    "layer_norm": (
        lambda w, x: (F.layer_norm(x, (3,), w[0]) * x).sum(),
        lambda w, x, t: (t.nn.functional.layer_norm(x, (3,), w[0]) * x).sum(),
    ),
    "mul": (lambda w, x: (w[:2] * x).sum(), lambda w, x, t: (w[:2] * x).sum()),
    "add": (lambda w, x: ((w[:2] + x) * x).sum(), lambda w, x, t: ((w[:2] + x) * x).sum()),
    "exp": (lambda w, x: (w[:2].exp() * x).sum(), lambda w, x, t: (w[:2].exp() * x).sum()),
    "relu": (lambda w, x: (F.relu(w[:2]) * x).sum(), lambda w, x, t: (t.relu(w[:2]) * x).sum()),
    "matmul": (lambda w, x: ((x @ w) ** 2).sum(), lambda w, x, t: ((x @ w) ** 2).sum()),
    "div": (lambda w, x: (w[:2] / (x * x + 1.0)).sum(), lambda w, x, t: (w[:2] / (x * x + 1.0)).sum()),
    "square": (lambda w, x: (w[:2] ** 2 * x).sum(), lambda w, x, t: (w[:2] ** 2 * x).sum()),
}
# whether the backward raises, with x requiring grad and with x a constant (w is then saved for no gradient)
RAISES = {
    ("linear", True): True,
    ("linear", False): False,
    ("layer_norm", True): True,
    ("mul", True): True,
    ("add", True): False,
    ("exp", True): False,
    ("relu", True): False,  # relu saves its output, as PyTorch's
    ("mul", False): False,  # mul, matmul and div save w only for x's gradient, as PyTorch's
    ("matmul", True): True,
    ("matmul", False): False,
    ("div", False): False,
    ("square", False): True,  # w ** 2 saves w for its own gradient
}


@pytest.mark.parametrize(("name", "x_grad"), RAISES)
def test_pytorch_raises_on_the_same_programs(name, x_grad):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    w0, x0 = rng.normal(size=(3, 3)), rng.normal(size=(2, 3))
    ours, theirs = PROGRAMS[name]

    w, x = leaf(w0.copy()), Tensor(x0, requires_grad=x_grad)  # (a copy: our step writes into w's array)
    loss = ours(w, x)
    step(OPTIMIZERS["sgd"], [w])
    tw, tx = torch.tensor(w0, requires_grad=True), torch.tensor(x0, requires_grad=x_grad)
    torch_loss = theirs(tw, tx, torch)
    tw.grad = torch.ones_like(tw)
    torch.optim.SGD([tw], lr=0.1).step()

    if RAISES[name, x_grad]:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch_loss.backward()
        with pytest.raises(RuntimeError, match="modified in place"):
            loss.backward()
    else:
        tw.grad = w.grad = None
        torch_loss.backward()
        loss.backward()
        np.testing.assert_allclose(w.grad, tw.grad.numpy(), rtol=1e-12)
        if x_grad:
            np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12)


# -- never silently wrong: random programs, a step between forward and backward -------------------------
def _params(rng):
    return {
        "w": leaf(rng.normal(size=(3, 4))),
        "v": leaf(rng.normal(size=(4, 4))),
        "g": leaf(1.0 + 0.1 * rng.normal(size=4)),
        "b": leaf(rng.normal(size=4)),
    }


# each takes the pool's last tensor h (3, 4), one other tensor o of the pool (3, 4) and the parameters p
STEPS = {
    "add": lambda h, o, p: h + o,
    "sub": lambda h, o, p: o - h,
    "mul": lambda h, o, p: h * o,
    "div": lambda h, o, p: h / (o * o + 1.0),
    "square": lambda h, o, p: h**2,
    "exp": lambda h, o, p: (0.1 * h).exp(),
    "tanh": lambda h, o, p: h.tanh(),
    "sqrt": lambda h, o, p: (h * h + 1.0).sqrt(),
    "log": lambda h, o, p: (h * h + 1.0).log(),
    "relu": lambda h, o, p: F.relu(h),
    "gelu": lambda h, o, p: F.gelu(h),
    "softmax": lambda h, o, p: F.softmax(h, axis=-1),
    "matmul": lambda h, o, p: h @ p["v"],
    "linear": lambda h, o, p: F.linear(h, p["v"], p["b"]),
    "layer_norm": lambda h, o, p: F.layer_norm(h, (4,), p["g"], p["b"]),
    "rms_norm": lambda h, o, p: F.rms_norm(h, (4,), p["g"]),
    "scale": lambda h, o, p: h * p["g"] + p["b"],
    "permute_columns": lambda h, o, p: h[:, np.array([2, 0, 3, 1])],
    "row_of_v": lambda h, o, p: h * p["v"][1],
    "masked_fill": lambda h, o, p: h.masked_fill(np.array([True, False, False, True]), 0.5),
    "transpose_twice": lambda h, o, p: h.T.reshape(4, 3).T,
}


@given(
    program=st.lists(st.tuples(st.sampled_from(sorted(STEPS)), st.integers(0, 10)), min_size=1, max_size=6),
    stepped=st.lists(st.sampled_from(["w", "v", "g", "b"]), min_size=1, max_size=4, unique=True),
    seed=st.integers(0, 2**16),
)
def test_a_step_between_forward_and_backward_raises_or_leaves_the_gradient_as_it_was(program, stepped, seed):
    # the property users rely on: a backward after a step either raises, or gives exactly the gradient
    # that a backward before the step gave; never one computed from the stepped values
    rng = np.random.default_rng(seed)
    p = _params(rng)
    pool = [p["w"], leaf(rng.normal(size=(3, 4)))]
    for name, pick in program:
        pool.append(STEPS[name](pool[-1], pool[pick % len(pool)], p))
    loss = sum((t * Tensor(rng.normal(size=(3, 4)))).sum() for t in pool[2:])
    before = mg.grad(loss, list(p.values()), retain_graph=True)
    for name in stepped:
        p[name].grad = rng.normal(size=p[name].shape)
    SGD([p[name] for name in stepped], lr=0.5).step()
    try:
        after = mg.grad(loss, list(p.values()))
    except RuntimeError as e:
        assert "modified in place" in str(e)
        event("refused")
        return
    event("compared")
    for name, b, a in zip(p, before, after, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


# -- in-place ops: PyTorch's, outside the graph, counted ---------------------------------------------
def test_in_place_ops_write_count_and_return_self():
    w = leaf([1.0, 2.0, 4.0], dtype=np.float32)
    loss = (w * w).sum()
    with mg.no_grad():
        out = w.add_(np.ones(3), alpha=0.5).mul_(2.0).sub_(Tensor(np.array([1.0, 1.0, 1.0])), alpha=2.0).div_(4.0)
    assert out is w and w.dtype == np.float32 and w._version == 4
    np.testing.assert_array_equal(w.data, np.array([0.25, 0.75, 1.75], np.float32))  # ((w + .5) 2 - 2) / 4
    with pytest.raises(RuntimeError, match="Mul.backward: .*modified in place.*version 4"):
        loss.backward()
    i = Tensor(np.arange(3))
    np.testing.assert_array_equal(i.copy_(np.array([1.7, -2.5, 3.2])).data, [1, -2, 3])  # truncated, as PyTorch
    np.testing.assert_array_equal(i.fill_(2.9).data, [2, 2, 2])
    np.testing.assert_array_equal(i.zero_().data, [0, 0, 0])
    np.testing.assert_array_equal(Tensor(np.zeros((2, 3))).copy_(np.arange(3.0)).data, [[0, 1, 2], [0, 1, 2]])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: leaf([1.0]).add_(1.0), r"add_: a tensor that requires grad \(shape \(1,\)\) cannot take part"),
        (lambda: Tensor(np.arange(3)).div_(2), "div_: result type float64 can't be cast to the tensor's dtype int64"),
        (lambda: Tensor(np.arange(3)).mul_(0.5), "mul_: result type float64 can't be cast to the tensor's dtype"),
        (lambda: Tensor(np.arange(3)).add_(1, alpha=0.5), "add_: result type float64 can't be cast"),
        (lambda: Tensor(np.zeros(1, np.int8)).add_(5, alpha=1000), "add_: alpha 1000 cannot be converted to .* int8"),
        (lambda: Tensor(np.ones(3)).add_(np.ones(3) * 1j), "add_: result type complex128 can't be cast"),
        (lambda: Tensor(np.ones(3)).copy_(np.ones(3) * 1j), "copy_: result type complex128 can't be cast"),
        (
            lambda: Tensor(np.arange(3)).fill_(np.nan),
            "fill_: value nan cannot be converted to the tensor's dtype int64",
        ),
        (lambda: Tensor(np.ones(3)).add_(np.ones(4)), r"add_: a value of shape \(4,\) does not broadcast to .* \(3,\)"),
        (lambda: Tensor(np.broadcast_to(np.ones(3), (2, 3))).zero_(), r"zero_: the tensor's array .* is read-only"),
    ],
)
def test_in_place_ops_refuse_what_pytorch_refuses(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
    with pytest.raises(TypeError, match=r"sub_: subtraction with a bool tensor"):
        Tensor(np.ones(2)).sub_(np.array([True, False]))
    with pytest.raises(ValueError, match=r"fill_: value must be a number or a 0-d tensor, got shape \(2,\)"):
        Tensor(np.ones(3)).fill_(np.ones(2))


def test_in_place_ops_compute_alpha_times_other_in_the_result_dtype_as_pytorch():
    # alpha * other was computed in other's dtype: int8 100 * 2 wrapped to -56, a float32 lost precision
    np.testing.assert_array_equal(Tensor(np.zeros(1, np.int64)).add_(np.array([100], np.int8), alpha=2).data, [200])
    assert Tensor(np.zeros(1)).add_(np.float32(0.1), alpha=1000).data[0] == float(np.float32(0.1)) * 1000
    np.testing.assert_array_equal(Tensor(np.zeros(1, np.float32)).sub_(np.array([200], np.uint8), alpha=1).data, [-200])
    np.testing.assert_array_equal(Tensor(np.full(2, 10, np.uint8)).add_(np.array([-1, 2], np.int8)).data, [9, 12])
    np.testing.assert_array_equal(Tensor(np.array([True, False])).mul_(np.array([True, True])).data, [True, False])
    np.testing.assert_array_equal(Tensor(np.array([True, False])).add_(True).data, [True, True])
    # a float32 tensor times a Python float: the float is cast first, as in PyTorch and in the out-of-place op
    t = Tensor(np.array([5.0], np.float32))
    assert (
        t.mul_(1 / 3).data[0]
        == (Tensor(np.array([5.0], np.float32)) * (1 / 3)).data[0]
        == np.float32(5) * np.float32(1 / 3)
    )


def test_an_element_taken_by_index_is_a_view_whose_writes_reach_its_tensor():
    # NumPy gives one element as a scalar, a copy: the write was lost, and not counted
    x = Tensor(np.arange(3.0))
    x[1].fill_(9.0)
    np.testing.assert_array_equal(x.data, [0.0, 9.0, 2.0])
    w = leaf(np.arange(4.0).reshape(2, 2))
    loss = (w * w).sum()
    with mg.no_grad():
        w[0, 1].fill_(100.0)
    with pytest.raises(RuntimeError, match="Mul.backward: .*modified in place"):
        loss.backward()


def test_a_value_that_requires_grad_is_not_silently_detached():
    w, buf = leaf([1.0, 2.0]), Tensor(np.zeros(2))
    with pytest.raises(RuntimeError, match=r"add_: a value that requires grad \(shape \(2,\)\) cannot take part"):
        buf.add_(w)
    with mg.no_grad():
        buf.add_(w)  # outside grad mode it is a value like any other
    np.testing.assert_array_equal(buf.data, [1.0, 2.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_in_place_ops_against_pytorch(dtype):
    torch = pytest.importorskip("torch")
    a = np.array([3, -2, 7], dtype)
    ours, theirs = Tensor(a.copy()), torch.tensor(a.copy())
    ops_ = [("add_", (np.array([1, 2, 3], dtype),), {"alpha": 2}), ("sub_", (5,), {}), ("mul_", (3,), {})]
    if dtype != np.int64:
        ops_ += [("div_", (np.array([4, 8, 16], dtype),), {}), ("fill_", (1.5,), {})]
    ops_ += [("copy_", (np.array([9, 8, 7], dtype),), {}), ("zero_", (), {})]
    for name, args, kwargs in ops_:
        getattr(ours, name)(*args, **kwargs)
        getattr(theirs, name)(*(torch.tensor(x) if isinstance(x, np.ndarray) else x for x in args), **kwargs)
        np.testing.assert_array_equal(ours.data, theirs.numpy(), err_msg=name)


def test_alpha_may_be_a_0d_tensor_as_in_pytorch():
    np.testing.assert_array_equal(Tensor(np.ones(2)).add_(np.ones(2), alpha=Tensor(np.array(2.5))).data, [3.5, 3.5])
    np.testing.assert_array_equal(Tensor(np.ones(2)).sub_(1.0, alpha=np.array(3.0)).data, [-2.0, -2.0])
    with pytest.raises(ValueError, match=r"add_: alpha must be a number or a 0-d tensor, got shape \(2,\)"):
        Tensor(np.ones(2)).add_(1.0, alpha=np.ones(2))
    with pytest.raises(TypeError, match=r"add_: alpha must be a number or a 0-d tensor, got str"):
        Tensor(np.ones(2)).add_(1.0, alpha="2")
    with pytest.raises(RuntimeError, match=r"add_: result type float64 can't be cast to the tensor's dtype int8"):
        Tensor(np.ones(2, np.int8)).add_(1, alpha=Tensor(np.array(2.5)))


def _views(t: Tensor) -> list[Tensor]:
    return [t[0:2], t.reshape(3), t.reshape(3)[1:], t[1]]


def test_a_view_made_under_no_grad_of_a_tensor_that_requires_grad_is_not_written_in_grad_mode():
    w = leaf([1.0, 2.0, 3.0])
    with mg.no_grad():
        views, copy, detached = _views(w), w + 0.0, w.detach()
    for v in [*views, views[0][0:1]]:  # a view of such a view too, made in grad mode
        with pytest.raises(RuntimeError, match=r"add_: the tensor .* is a view, made under no_grad\(\), of a tensor"):
            v.add_(1.0)
    np.testing.assert_array_equal(w.data, [1.0, 2.0, 3.0])
    copy.add_(1.0)
    detached.mul_(2.0)  # .detach() shares the memory and may be written, as in PyTorch
    np.testing.assert_array_equal(w.data, [2.0, 4.0, 6.0])
    with mg.no_grad():
        views[0].add_(1.0)  # both inside no_grad(): allowed
    np.testing.assert_array_equal(w.data, [3.0, 5.0, 6.0])
    x = Tensor(np.ones(3))
    with mg.no_grad():
        xv = x[0:2]
    xv.add_(1.0)  # a view of a tensor that needs no grad
    np.testing.assert_array_equal(x.data, [2.0, 2.0, 1.0])


def test_the_no_grad_view_rule_matches_pytorch():
    torch = pytest.importorskip("torch")
    for k in range(len(_views(Tensor(np.ones(3))))):
        w, tw = leaf([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with mg.no_grad():
            v = _views(w)[k]
        with torch.no_grad():
            tv = [tw[0:2], tw.reshape(3), tw.reshape(3)[1:], tw[1]][k]
        raised = []
        for view in (v, tv):
            try:
                view.add_(1.0)
                raised.append(False)
            except RuntimeError:
                raised.append(True)
        assert raised == [True, True], k
