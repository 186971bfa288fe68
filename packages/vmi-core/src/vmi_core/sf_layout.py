"""Deprecated: moved to ``vmi_quant.sf_layout`` (vmi-quant), the only family that uses it; this alias goes in
vmi-core 0.2 (see docs/core.md). It needs vmi-quant installed."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("vmi_core.sf_layout moved to vmi_quant.sf_layout; import it from there", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module("vmi_quant.sf_layout"), name)
