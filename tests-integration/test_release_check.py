"""scripts/release_check.py's checks that need no build: the tag against the package's version, and a
family's vmi-core pin against the in-tree vmi-core (the build, twine and fresh-venv steps run under
``nox -s release`` and ``nox -s build``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("release_check", ROOT / "scripts" / "release_check.py")
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)


@pytest.mark.parametrize("package", rc.PACKAGES)
def test_the_tag_of_the_current_version_passes(package):
    version = rc.project(package)["version"]
    assert rc.check_version(package, f"{package}-v{version}") == version


@pytest.mark.parametrize(("tag", "says"), [
    ("vmi-moe-v9.9.9", "tag vmi-moe-v9.9.9 says 9.9.9"),
    ("vmi-quant-v0.1.0", "is for vmi-quant, not vmi-moe"),
    ("vmi-foo-v0.1.0", "is not <package>-vX.Y.Z"),
    ("vmi-moe-0.1.0", "is not <package>-vX.Y.Z"),
])
def test_a_tag_that_does_not_match_fails(tag, says):
    with pytest.raises(rc.CheckFailed, match=says):
        rc.check_version("vmi-moe", tag)


@pytest.mark.parametrize("package", ["vmi-quant", "vmi-mhc", "vmi-moe"])
def test_family_pins_admit_the_in_tree_core(package):
    assert rc.check_core_pin(package) == rc.project("vmi-core")["version"]
    assert rc.check_core_pin("vmi-core") is None


def test_a_family_needing_a_newer_core_fails(monkeypatch):
    project = rc.project
    monkeypatch.setattr(rc, "project", lambda p: {**project(p), "dependencies": ["vmi-core~=0.2.0"]}
                        if p == "vmi-moe" else project(p))
    with pytest.raises(rc.CheckFailed, match=r"requires vmi-core~=0.2.0, which the in-tree vmi-core 0.1.0"):
        rc.check_core_pin("vmi-moe")
