"""The five vmi distributions are installed, at the versions their pyproject.toml declare, the
family packages depend on a compatible vmi-core, and the meta-package ``vmi`` on all four at
their in-tree versions."""

from __future__ import annotations

import importlib
import re
import sys
from importlib.metadata import distribution, requires, version
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {
    "vmi-core": "vmi_core",
    "vmi-quant": "vmi_quant",
    "vmi-mhc": "vmi_mhc",
    "vmi-moe": "vmi_moe",
    "vmi": "vmi",
}
FAMILIES = ("vmi-quant", "vmi-mhc", "vmi-moe")


def _pyproject(dist: str) -> dict:
    with open(ROOT / "packages" / dist / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_the_version_is_written_once(dist: str) -> None:
    """pyproject.toml takes the version from the module (hatch), so the metadata and
    ``__version__`` agree."""
    project = _pyproject(dist)
    assert project["name"] == dist
    assert "version" not in project and "version" in project["dynamic"]
    assert version(dist) == importlib.import_module(DISTRIBUTIONS[dist]).__version__


@pytest.mark.parametrize("dist", FAMILIES)
def test_family_requires_compatible_core(dist: str) -> None:
    reqs = [re.sub(r"\s+", "", r) for r in requires(dist) or []]
    assert "vmi-core~=0.1.0" in reqs, f"{dist} requires {reqs}"


def test_the_meta_package_requires_each_package_at_its_version() -> None:
    reqs = sorted(re.sub(r"\s+", "", r) for r in requires("vmi") or [])
    assert reqs == sorted(f"{dist}=={version(dist)}" for dist in DISTRIBUTIONS if dist != "vmi")


def test_core_pins_tilelang_and_declares_cli() -> None:
    reqs = [re.sub(r"\s+", "", r) for r in requires("vmi-core") or []]
    assert "tilelang==0.1.15" in reqs, reqs
    eps = distribution("vmi-core").entry_points
    scripts = {ep.name: ep.value for ep in eps if ep.group == "console_scripts"}
    assert scripts.get("vmi") == "vmi_core.tools.cli:main"


def test_quant_registers_ops_entry_point() -> None:
    eps = {ep.name: ep.value for ep in distribution("vmi-quant").entry_points if ep.group == "vmi.ops"}
    assert eps == {"quant": "vmi_quant"}


@pytest.mark.parametrize(("old", "new", "name"), [("vmi_core.sf_layout", "vmi_quant.sf_layout", "SFLayout"),
                                                  ("vmi_core.softplus", "vmi_moe.softplus", "sqrt_softplus"),
                                                  ("vmi_core.tl.softplus", "vmi_moe.tl.softplus", "SQRT_LN2")])
def test_moved_modules_keep_a_deprecated_alias(old, new, name):
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_each_package_ships_the_licence_and_py_typed(dist: str) -> None:
    """Each package directory holds the root LICENSE (a copy: an sdist cannot carry a link out of
    its directory), declares it, and marks its module typed; the built artefacts are checked by
    ``scripts/release_check.py`` (``nox -s build``)."""
    package = ROOT / "packages" / dist
    assert (package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert _pyproject(dist)["license-files"] == ["LICENSE"]
    assert (package / "src" / DISTRIBUTIONS[dist] / "py.typed").is_file()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
