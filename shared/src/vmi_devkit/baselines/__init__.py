"""Torch baselines of ``vmi bench``, found through the ``vmi.baselines`` entry points.

Each module maps op names to ``baseline(op, options) -> vmi_core.tools.bench.Baseline`` in ``BASELINES``:
the fastest straightforward torch composition of the op for those options. They live here, beside
the repository's tests, and not in the family wheels: a user's installed ``vmi bench`` times the
kernel, the reference and the copy bandwidth, and says that no baseline is installed.
"""
