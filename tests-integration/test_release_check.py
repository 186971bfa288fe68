"""scripts/release_check.py's checks that need no build: the tag against the package's version, a
family's vmi-core pin against the in-tree vmi-core and that vmi-core on a package index (a local one
made here), and the artefacts' licence and ``py.typed`` on hand-made files (the build, twine and
fresh-venv steps run under ``nox -s release`` and ``nox -s build``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("release_check", ROOT / "scripts" / "release_check.py")
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)


@pytest.mark.parametrize("package", rc.PACKAGES)
def test_the_current_version_passes_and_its_tag_needs_a_dated_heading(package):
    version = rc.version_of(package)
    assert rc.check_version(package, None) == version
    changelog = (ROOT / "packages" / package / "CHANGELOG.md").read_text()
    if "unreleased" in changelog.split("\n## ")[1].splitlines()[0]:
        with pytest.raises(rc.CheckFailed, match="must carry the release date"):
            rc.check_version(package, f"{package}-v{version}")
    else:
        assert rc.check_version(package, f"{package}-v{version}") == version


@pytest.mark.parametrize(("heading", "released", "says"), [
    ("## [0.2.0] - 2026-12-04", True, None),
    ("## [0.2.0] - unreleased", False, None),
    ("## [0.2.0] - unreleased", True, "must carry the release date"),
    ("## [0.2.0]", True, "must carry the release date"),
    ("## [0.1.9] - 2026-12-04", False, "has no '## \\[0.2.0\\]' entry"),
])
def test_changelog_heading(heading, released, says):
    text = f"# Changelog\n\n{heading}\n\n### Added\n\n- a thing\n"
    if says is None:
        rc.check_changelog(text, "vmi-moe", "0.2.0", released)
    else:
        with pytest.raises(rc.CheckFailed, match=says):
            rc.check_changelog(text, "vmi-moe", "0.2.0", released)


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
    assert rc.check_vmi_pins(package) == {"vmi-core": rc.version_of("vmi-core")}
    assert rc.check_vmi_pins("vmi-core") == {}


def test_the_meta_package_pins_every_package_at_its_in_tree_version():
    assert rc.check_vmi_pins("vmi") == {p: rc.version_of(p) for p in rc.PACKAGES if p != "vmi"}


@pytest.mark.parametrize(("package", "requirements", "says"), [
    ("vmi-moe", ["vmi-core~=0.2.0"], r"requires vmi-core~=0.2.0, which the in-tree vmi-core 0.1.0"),
    ("vmi", ["vmi-core==0.1.0", "vmi-moe==0.0.1"], r"requires vmi-moe==0.0.1, which the in-tree vmi-moe 0.1.0"),
    ("vmi-mhc", ["numpy"], "does not declare its vmi-core requirement"),
])
def test_a_pin_the_tree_does_not_satisfy_fails(monkeypatch, package, requirements, says):
    project = rc.project
    monkeypatch.setattr(rc, "project", lambda p: {**project(p), "dependencies": requirements}
                        if p == package else project(p))
    with pytest.raises(rc.CheckFailed, match=says):
        rc.check_vmi_pins(package)


def _index_with_core(root: Path, version: str) -> str:
    """A PEP 503 index in ``root`` holding one minimal vmi-core wheel; its URL."""
    import zipfile

    project = root / "vmi-core"
    project.mkdir(parents=True)
    name = f"vmi_core-{version}-py3-none-any.whl"
    info = f"vmi_core-{version}.dist-info"
    with zipfile.ZipFile(project / name, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: vmi-core\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    (project / "index.html").write_text(f'<a href="{name}">{name}</a>\n')
    return root.as_uri()


def test_a_family_release_needs_its_core_on_the_index(tmp_path, monkeypatch):
    """Checked before anything is built: a family whose vmi-core is not on the index fails, naming
    the way out; on the index, or released in the same run, it goes on to the build."""
    index = _index_with_core(tmp_path / "index", "0.0.9")
    core = rc.version_of("vmi-core")
    with pytest.raises(rc.CheckFailed, match=rf"vmi-core {core} .* is not on {index}: release vmi-core {core} first"):
        rc.check_published("vmi-core", core, index)
    rc.check_published("vmi-core", "0.0.9", index)

    def built(package, out, sdist=True):
        raise rc.CheckFailed(f"building {package}")

    monkeypatch.setattr(rc, "build", built)
    run = dict(tag=None, out=tmp_path / "out", venv_dir=tmp_path / "venv", torch_index=None, index=index)
    with pytest.raises(rc.CheckFailed, match="is not on"):
        rc.release_check("vmi-moe", **run)
    with pytest.raises(rc.CheckFailed, match="building vmi-core"):
        rc.release_check("vmi-moe", **run, with_deps=True)
    with pytest.raises(rc.CheckFailed, match="building vmi-core"):
        rc.release_check("vmi-core", **run)


def _wheel(path: Path, licence: bytes | None, typed: bool, declared: bool = True) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("vmi_moe-0.1.0.dist-info/METADATA",
                       "Metadata-Version: 2.4\nName: vmi-moe\n" + ("License-File: LICENSE\n" if declared else ""))
        if licence is not None:
            wheel.writestr("vmi_moe-0.1.0.dist-info/licenses/LICENSE", licence)
        if typed:
            wheel.writestr("vmi_moe/py.typed", "")
    return path


def test_artefacts_must_carry_the_licence_and_py_typed(tmp_path):
    """The contents check of every build (``rc.build``), on hand-made artefacts."""
    import io
    import tarfile

    licence = (ROOT / "LICENSE").read_bytes()
    rc.check_contents("vmi-moe", [_wheel(tmp_path / "good.whl", licence, True)])
    for name, args, says in (("none.whl", (None, True), "does not carry the LICENSE"),
                             ("other.whl", (b"Apache", True), "does not carry the LICENSE"),
                             ("untyped.whl", (licence, False), "has no vmi_moe/py.typed"),
                             ("undeclared.whl", (licence, True, False), "does not declare its LICENSE")):
        with pytest.raises(rc.CheckFailed, match=says):
            rc.check_contents("vmi-moe", [_wheel(tmp_path / name, *args)])
    sdist = tmp_path / "vmi_moe-0.1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        link = tarfile.TarInfo("vmi_moe-0.1.0/LICENSE")
        link.type, link.linkname = tarfile.SYMTYPE, "../../LICENSE"
        tar.addfile(link)
    with pytest.raises(rc.CheckFailed, match="does not carry the LICENSE as a file"):
        rc.check_contents("vmi-moe", [sdist])
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("vmi_moe-0.1.0/LICENSE")
        info.size = len(licence)
        tar.addfile(info, io.BytesIO(licence))
    rc.check_contents("vmi-moe", [sdist])
