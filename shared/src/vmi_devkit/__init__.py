"""vmi-devkit: what the tests and tools of every vmi package share and no wheel ships.

``vmi_devkit.baselines``: the torch baselines of ``vmi bench`` (entry point group ``vmi.baselines``).
"""
