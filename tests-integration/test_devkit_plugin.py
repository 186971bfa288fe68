"""vmi-devkit's pytest plugin as a user runs it: --target keeps the tests parametrized over the named
targets, the default keeps every target this machine runs, an unknown target is a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Parametrized over target ("cpu", "ascend-sim") and one test that is not.
TESTS = "packages/vmi-moe/tests/test_moe_contracts.py"


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args, TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def ids(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_target_selects_and_the_default_is_every_runnable_target():
    everything = ids(collect())
    cpu = ids(collect("--target", "cpu"))
    sim = ids(collect("--target", "ascend-sim"))
    assert any("[cpu]" in i for i in cpu) and not any("[ascend-sim]" in i for i in cpu)
    assert any("[ascend-sim]" in i for i in sim) and not any("[cpu]" in i for i in sim)
    untargeted = [i for i in everything if "[" not in i]
    assert untargeted and all(i in cpu and i in sim for i in untargeted)
    assert sorted(everything) == sorted(set(cpu) | set(sim))


def test_unknown_target_is_a_usage_error():
    result = collect("--target", "rocm")
    assert result.returncode == 4 and "unknown target(s) rocm" in result.stderr


def test_slow_budget_skips_the_slow_tests_left_when_it_is_spent(tmp_path):
    """A budget of 0 s is spent before the first test: in the xdist worker (which must inherit the
    controller's deadline) every slow test is skipped with the reason, every other test runs."""
    (tmp_path / "test_budget.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.slow\n@pytest.mark.parametrize('i', range(4))\ndef test_slow(i):\n    pass\n\n"
        "@pytest.mark.parametrize('i', range(2))\ndef test_quick(i):\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-rs", "-p", "no:cacheprovider",
                             "--slow-budget", "0", "test_budget.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed, 4 skipped" in result.stdout
    assert result.stdout.count("budget of 0 s is spent (--slow-budget)") >= 1
