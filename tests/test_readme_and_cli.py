"""The README's examples run as written, and the command line behaves."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minigrad_norm
from minigrad_norm.cli import main
from minigrad_norm.tensor import Tensor

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_examples_run(index):
    exec(compile(python_blocks()[index], f"README.md block {index}", "exec"), {"__name__": "readme"})


def test_readme_quickstart_commands_are_the_ones_ci_runs():
    text = README.read_text()
    assert 'python -m pip install -e ".[test]" && minigrad-norm check' in text
    assert "\npython -m pytest\n" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'python -m pip install -e ".[test]" && minigrad-norm check' in ci
    assert "\npython -m pytest\n" in ci


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"minigrad-norm {minigrad_norm.__version__}"


def test_check_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["check", "--only", "matmul", "softmax", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"matmul \(batched, broadcast\)\s+2x1x3x4 3x4x2\s+\S+\s+\S+\s+-\s+pass", text)
    rows = json.loads(out.read_text())
    assert {r["name"] for r in rows} == {
        "matmul (batched, broadcast)",
        "matmul (vector)",
        "softmax (axis 0)",
        "log_softmax",
    }
    assert all(r["passed"] and r["fd_abs_err"] < 1e-6 for r in rows)


@pytest.mark.parametrize("wrong", ["factor", "shape"])
def test_check_exits_nonzero_when_an_op_fails(monkeypatch, capsys, wrong):
    from minigrad_norm import ops

    right = ops.Mul.backward
    if wrong == "factor":
        bad = staticmethod(lambda ctx, g: tuple(2 * d for d in right(ctx, g)))
    else:
        bad = staticmethod(lambda ctx, g: (g, g))  # forgets to sum over the broadcast axes
    monkeypatch.setattr(ops.Mul, "backward", bad)
    assert main(["check", "--only", "mul (broadcast)", "div"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"mul \(broadcast\).*FAIL", out) and re.search(r"div \(broadcast\).*pass", out)
    assert "1 passed, 1 failed" in out


def test_check_says_once_on_stderr_when_a_row_takes_a_while(monkeypatch, capsys):
    """A row slower than CHECK_SLOW_ROW_SECONDS (a norm compiling its numba kernels on first use) gets one note
    on stderr while it runs, however many rows are slow; fast rows get none."""
    import time

    from minigrad_norm import check, cli

    fast = check.run_case

    def slow(case, seed=0):
        time.sleep(0.3)
        return fast(case, seed)

    assert main(["check", "--only", "neg"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli, "CHECK_SLOW_ROW_SECONDS", 0.05)
    monkeypatch.setattr(check, "run_case", slow)
    assert main(["check", "--only", "neg", "abs"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("check: ") == 1
    assert "check: neg is taking a while: a norm's first use compiles its numba kernels" in captured.err
    assert "2 passed, 0 failed" in captured.out


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "minigrad_norm", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("minigrad-norm ")


TINY_TRAIN = "train --steps 1 --layers 1 --d-model 8 --heads 2 --d-ff 8 --batch-size 2 --no-progress".split()
TINY_DEPTH = "depth --layers 1 --mode pre --d-model 8 --heads 2 --d-ff 8 --batch-size 2".split()


@pytest.fixture
def no_work(monkeypatch):
    """Make every command's work fail, so that a test passing with it shows an error came before any work."""
    from minigrad_norm import bench, check, depth, train

    def work(*args, **kwargs):
        raise AssertionError("the command started its work")

    for module, name in [(check, "run_case"), (train, "train"), (depth, "run_experiment"), (bench, "main")]:
        monkeypatch.setattr(module, name, work)


OUTPUTS = [(["check"], "--json")]
OUTPUTS += [(cmd, opt) for cmd in (TINY_TRAIN, TINY_DEPTH) for opt in ("--json", "--plot")]
OUTPUTS += [(["bench", "--quick"], opt) for opt in ("--json", "--markdown", "--plot")]


@pytest.mark.parametrize(("command", "option"), OUTPUTS)
def test_an_unwritable_output_path_is_refused_before_any_work(tmp_path, capsys, no_work, command, option):
    (tmp_path / "file").write_text("")
    for path, why in [
        (tmp_path / "missing" / "out", "does not exist"),
        (tmp_path / "file" / "out", "is not a directory"),
        (tmp_path, "is a directory"),
    ]:
        assert main([*command, option, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{command[0]}: {option} {path}: ") and why in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--length", "0"], "--length must be positive, got 0"),
        (["train", "--lr", "-1"], "--lr must be a positive number, got -1.0"),
        (["train", "--lr", "nan"], "--lr must be a positive number, got nan"),
        (["train", "--warmup", "-5", "--steps", "2"], "--warmup must be >= 0, got -5"),
        (["train", "--clip", "-1"], "--clip must be >= 0 (0 = off), got -1.0"),
        (["train", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["depth", "--lr", "-1", "--train-steps", "1"], "--lr must be a positive number, got -1.0"),
        (["depth", "--train-steps", "-3"], "--train-steps must be >= 0, got -3"),
        (["check", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["compile", "--processes", "0"], "--processes must be positive, got 0"),
        (["bench", "--only", "layer_norm", "nonsense"], "--only: unknown norm nonsense; the norms are layer_norm,"),
        (["bench", "--only", "batch_norm2d", "--shape", "8192x1024"], "--shape 8192x1024: batch_norm2d takes (N, C,"),
        (["bench", "--shape", "8192x0"], "--shape 8192x0: every size must be at least 1"),
        (["bench", "--only", "layer_norm", "--shape", "8x"], "--shape 8x: expected sizes joined by 'x'"),
        (["bench", "--groups", "4"], "--groups 4 is for --shape"),
        (["bench", "--only", "rms_norm", "--plot", "p.png"], "--plot p.png: the plot is of the LayerNorm size sweep"),
        (["bench", "--only", "layer_norm", "--shape", "8x8", "--groups", "2"], "--groups 2 is GroupNorm's"),
        (
            ["bench", "--only", "layer_norm", "--shape", "99999999999999999999x2"],
            "--shape 99999999999999999999x2: a run holds about 16 arrays of x's size in float64",
        ),
        (["bench", "--quick", "--json", ""], "--json: the path is empty"),
        (["check", "--json", "/proc/no_such_file.json"], "--json /proc/no_such_file.json: not writable"),
        (["bench", "--quick", "--json", "r.out", "--markdown", "r.out"], "--markdown r.out: --json writes the same"),
        (["bench", "--quick", "--json", "r.out", "--markdown", "./r.out"], "--markdown ./r.out: --json writes the"),
        (["train", "--lr", "inf"], "--lr must be a positive number, got inf"),
        (["train", "--weight-decay", "nan"], "--weight-decay must be >= 0, got nan"),
        (["train", "--clip", "nan"], "--clip must be >= 0 (0 = off), got nan"),
    ],
)
def test_bad_option_values_are_refused_before_any_work(capsys, no_work, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{argv[0]}: {message}") and err.count("\n") == 1


def test_compile_compiles_every_kernel_for_the_dtypes_asked_and_says_where(monkeypatch, capsys):
    from minigrad_norm.kernels import numba_cpu

    calls = []
    monkeypatch.setattr(numba_cpu, "compile_every_kernel", lambda *args, **options: calls.append((args, options)))
    assert main(["compile", "--dtype", "float32", "--no-progress", "--processes", "1"]) == 0
    assert main(["compile"]) == 0
    assert calls == [
        ((["float32"],), {"progress": False, "processes": 1}),
        ((["float32", "float64"],), {"progress": True, "processes": None}),
    ]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("compiled every kernel for float32 in ")
    assert out[0].endswith(f"cached in {numba_cpu.cache_path()}") and out[1].startswith(
        "compiled every kernel for float32 and float64"
    )


def test_the_writability_probe_leaves_no_file_behind(tmp_path, capsys, no_work):
    out = tmp_path / "r.json"
    with pytest.raises(AssertionError, match="started its work"):  # the checks passed, then the work began
        main(["check", "--json", str(out)])
    assert not out.exists()


def test_the_benchmark_scripts_refuse_an_unwritable_output_before_the_run(tmp_path):
    """``benchmarks/train_step.py --json`` to a missing directory failed after its minutes of timing."""
    from minigrad_norm import bench

    bad_paths = [("", "the path is empty"), (str(tmp_path), "is a directory"), ("/nowhere/r.json", "not exist")]
    for bad, message in bad_paths:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            bench.output_path(bad)
    good = str(tmp_path / "r.json")
    assert bench.output_path(good) == good and not (tmp_path / "r.json").exists()
    script = Path(__file__).parent.parent / "benchmarks" / "train_step.py"
    run = subprocess.run([sys.executable, script, "--json", "/nowhere/r.json"], capture_output=True, text=True)
    assert run.returncode == 2 and "--json: /nowhere/r.json: directory /nowhere does not exist" in run.stderr


def test_bench_memory_estimate_refuses_what_would_not_fit():
    from minigrad_norm import bench

    small, big = bench.shape_case("layer_norm", (1024, 1024)), bench.shape_case("rms_norm", (2048, 1024))
    need = bench.ARRAYS_OF_X_SIZE * 2048 * 1024 * 8 + bench.FIXED_BYTES  # (in float64, whatever x's dtype)
    assert bench.memory_error([small, big], need) is None
    assert "2048x1024: a run holds about 16 arrays of x's size in float64" in bench.memory_error([small, big], need - 1)


def test_train_refuses_a_run_that_would_not_fit_before_any_work(monkeypatch, capsys, no_work):
    """``train --length 1000`` holds attention arrays of 4 x 2000 x 2000 values a sequence: it ran out of memory
    part-way through. Refused now, naming the options and the sizes."""
    from minigrad_norm.kernels import machine

    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 8 * 2**30)
    assert main(["train", "--length", "1000"]) == 2
    assert re.search(r"--length 1000 .* needs about \d+\.\d GiB .* but 8\.0 GiB", capsys.readouterr().err)
    with pytest.raises(AssertionError, match="started its work"):  # the default run fits
        main(["train"])


def test_train_memory_estimate_bounds_the_peak_where_attention_dominates():
    """The estimate's counts of attention arrays, against what a run holds at its peak (tracemalloc sees NumPy's
    allocations): an attention that saved more than it does now would make the estimate too low."""
    import tracemalloc

    from minigrad_norm.train import TrainConfig, memory_estimate, train

    cfg = TrainConfig(task="copy", length=100, layers=2, batch_size=4, eval_size=2, steps=1)
    train(cfg, progress=False)  # (the kernels compiled or loaded, outside the measurement)
    tracemalloc.start()
    try:
        train(cfg, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= memory_estimate(cfg) <= 2 * peak


def test_bench_times_a_shape_or_a_dtype_given_twice_once(monkeypatch):
    from minigrad_norm import bench

    seen = {}

    class Stop(Exception):
        pass

    def run(**kw):
        seen.update(kw)
        raise Stop  # (before the report)

    monkeypatch.setattr(bench, "run", run)
    with pytest.raises(Stop):
        main(["bench", "--only", "layer_norm", "--shape", "8x8", "8x8", "--dtype", "float32", "float32"])
    assert [c.shape for c in seen["cases"]] == [(8, 8)] and seen["dtypes"] == ["float32"]


def test_bench_group_norm_counts_a_group_s_channels():
    """Each group of (8, 64, 1, 1) with 8 groups holds 8 values; (8, 8, 1, 1) with 8 groups holds one per group
    and sample, which PyTorch's GroupNorm takes in training too (y is then its bias), where its InstanceNorm, with
    one value per map, refuses."""
    from minigrad_norm import bench

    assert bench.shape_case("group_norm", (8, 64, 1, 1), 8).view == (8, 8, 8, 1)
    assert bench.shape_case("group_norm", (8, 8, 1, 1), 8).view == (8, 8, 1, 1)
    with pytest.raises(ValueError, match="needs more than one value per statistic"):
        bench.shape_case("instance_norm2d", (8, 8, 1, 1))


@pytest.mark.parametrize("command", [["check"], ["bench", "--quick"], ["compile"], TINY_TRAIN])
def test_a_bad_backend_variable_is_refused_before_any_work(monkeypatch, capsys, no_work, command):
    monkeypatch.setenv("MINIGRAD_NORM_BACKEND", "cuda")
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minigrad-norm {command[0]}: MINIGRAD_NORM_BACKEND: unknown backend 'cuda'")
    assert err.count("\n") == 1


def test_an_empty_backend_variable_counts_as_unset(monkeypatch):
    from minigrad_norm import backend

    monkeypatch.setenv("MINIGRAD_NORM_BACKEND", "")
    assert backend.get_backend() == "numba"


def test_bench_without_the_numba_kernels_says_so_before_any_work(monkeypatch, capsys, no_work):
    from minigrad_norm import backend

    monkeypatch.setattr(backend, "_load_numba", lambda: None)
    assert main(["bench", "--quick", "--only", "layer_norm"]) == 2
    assert capsys.readouterr().err == "bench: the numba kernels are unavailable\n"


def test_bench_start_up_runs_the_numba_backend_whatever_the_environment_says(monkeypatch):
    from minigrad_norm import bench

    envs = []
    monkeypatch.setenv("MINIGRAD_NORM_BACKEND", "numpy")
    monkeypatch.setattr(bench.subprocess, "run", lambda *args, env, **kw: envs.append(env))
    bench.startup_seconds(cold=False)
    bench.startup_seconds(cold=True)
    assert [e["MINIGRAD_NORM_BACKEND"] for e in envs] == ["numba"] * 3


def test_check_json_is_strict_and_a_passing_row_prints_its_warning(monkeypatch, tmp_path, capsys):
    from minigrad_norm import check

    def broken(t):
        raise RuntimeError("a broken op")  # a row that raises reports infinite errors

    cases = [
        check.CheckCase("fails", lambda r: (Tensor(np.ones(2), requires_grad=True),), broken),
        check.CheckCase(
            "tiny", lambda r: (Tensor(np.ones(2), requires_grad=True),), lambda t: t * 1e-9, note="it is tiny"
        ),
    ]
    monkeypatch.setattr(check, "all_cases", lambda: cases)
    out = tmp_path / "check.json"
    assert main(["check", "--json", str(out)]) == 1
    rows = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert rows[0]["passed"] is False and rows[0]["fd_abs_err"] is None
    assert rows[1]["passed"] is True and rows[1]["message"].endswith("lower atol; it is tiny")
    assert "    note: gradcheck: every Jacobian entry of input(s) 0 is below atol" in capsys.readouterr().out


def test_compile_without_numba_says_there_is_nothing_to_compile(monkeypatch, capsys):
    from minigrad_norm import backend

    monkeypatch.setattr(backend, "_load_numba", lambda: None)
    assert main(["compile"]) == 1
    assert (
        capsys.readouterr().err
        == "compile: the numba kernels are unavailable: the NumPy backend has nothing to compile\n"
    )


def test_the_kernels_map_names_only_functions_and_constants_that_exist():
    """docs/kernels.md points into numba_cpu.py by name: a renamed function must not leave the map pointing at
    nothing."""
    from minigrad_norm.kernels import numba_cpu

    text = (README.parent / "docs" / "kernels.md").read_text()
    names = {n for n in re.findall(r"`(_[a-z][a-z_]*|[A-Z][A-Z_]{3,})`", text) if not n.startswith("NUMBA_")}
    assert len(names) > 20  # the map's tables and lists name this many
    assert sorted(n for n in names if not hasattr(numba_cpu, n)) == []
