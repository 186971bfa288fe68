"""Deprecated: moved to ``vmi_moe.tl.softplus`` (vmi-moe), the only family that uses it; this alias goes in
vmi-core 0.2 (see docs/core.md). It needs vmi-moe installed."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("vmi_core.tl.softplus moved to vmi_moe.tl.softplus; import it from there", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module("vmi_moe.tl.softplus"), name)
