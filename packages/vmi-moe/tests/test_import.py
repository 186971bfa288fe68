"""The package imports and its version matches the installed distribution."""

from importlib.metadata import version

import vmi_moe


def test_version_matches_distribution() -> None:
    assert vmi_moe.__version__ == version("vmi-moe")
