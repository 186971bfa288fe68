"""vmi-devkit's pytest plugin as a user runs it: --target keeps the tests parametrized over the named
targets, the default keeps every target this machine runs, an unknown target is a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Tests parametrized over target ("cpu", "ascend-sim", as the packages' are) and one that is not, in
# a folder of their own: collecting them imports no vmi family.
SAMPLE = """import pytest


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_targeted(target):
    pass


def test_untargeted():
    pass
"""


@pytest.fixture
def sample(tmp_path) -> Path:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    return tmp_path


def collect(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args,
                           "test_sample.py"], cwd=folder, capture_output=True, text=True, timeout=300)


def ids(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_target_selects_and_the_default_is_every_runnable_target(sample):
    everything = ids(collect(sample))
    cpu = ids(collect(sample, "--target", "cpu"))
    sim = ids(collect(sample, "--target", "ascend-sim"))
    assert any("[cpu]" in i for i in cpu) and not any("[ascend-sim]" in i for i in cpu)
    assert any("[ascend-sim]" in i for i in sim) and not any("[cpu]" in i for i in sim)
    untargeted = [i for i in everything if "[" not in i]
    assert untargeted and all(i in cpu and i in sim for i in untargeted)
    assert sorted(everything) == sorted(set(cpu) | set(sim))


def test_unknown_target_is_a_usage_error(sample):
    result = collect(sample, "--target", "rocm")
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
