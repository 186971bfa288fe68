"""Every op whose ``vmi`` options document values (choices, or a flag's two values) has a row in a
property module's ``DRAWN``; each module checks its own rows against the declarations
(``vmi_devkit.strategies.assert_every_option_value_drawn``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from vmi_core.library import KERNEL_OPS

ROOT = Path(__file__).resolve().parents[1]
PROPERTY_MODULES = sorted(ROOT.glob("packages/*/tests/test_properties*.py"))


def _drawn(path: Path) -> dict:
    spec = importlib.util.spec_from_file_location(f"{path.parents[1].name}.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DRAWN


def test_every_op_with_documented_option_values_has_a_drawn_row():
    listed = {op for path in PROPERTY_MODULES for op in _drawn(path)}
    enumerated = {name for name, op in KERNEL_OPS.items() if op.command is not None
                  and any(option.choices or isinstance(option.default, bool) for option in op.command.options)}
    assert len(PROPERTY_MODULES) == 4
    assert sorted(enumerated - listed) == []
