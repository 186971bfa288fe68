"""The packages' import graph has no circles, and the arrows run dispatch -> kernel -> vmi-core.

Read from the source (``vmi_devkit.imports``), function-local imports included.
"""

from __future__ import annotations

from pathlib import Path

from vmi_devkit.imports import import_cycles, import_graph

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "packages" / name / "src" for name in ("vmi-core", "vmi-quant", "vmi-mhc", "vmi-moe")]
GRAPH = import_graph(SOURCES)


def test_no_import_circles():
    assert import_cycles(GRAPH) == []


def test_kernels_import_no_dispatch():
    backwards = {(module, imported) for module, imports in GRAPH.items() if ".kernels" in module
                 for imported in imports if ".ops" in imported}
    assert backwards == set()


def test_vmi_core_imports_no_family():
    families = {(module, imported) for module, imports in GRAPH.items() if module.startswith("vmi_core")
                for imported in imports if not imported.startswith("vmi_core")}
    assert families == set()


def test_the_check_finds_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
