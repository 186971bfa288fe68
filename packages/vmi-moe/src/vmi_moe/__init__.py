"""vmi-moe: MoE routing ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference. The ops are being added; this release
provides the package and its version only.
"""

__version__ = "0.1.0"
