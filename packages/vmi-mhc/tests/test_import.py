"""The package imports and its version matches the installed distribution."""

from importlib.metadata import version

import vmi_mhc


def test_version_matches_distribution() -> None:
    assert vmi_mhc.__version__ == version("vmi-mhc")
