"""The README's examples run as written, and the command line behaves."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import minigrad_norm
from minigrad_norm.cli import main

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


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "minigrad_norm", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("minigrad-norm ")
