"""Session-wide test setup for the whole monorepo.

Compiled kernels go to ``<repo>/.cache/vmi`` (gitignored) unless ``$VMI_CACHE_DIR``
names another cache, so test runs never write under ``~`` and later runs reuse
the binaries. Set here, at import time, so every pytest-xdist worker sees it
before the first kernel is compiled.
"""

from __future__ import annotations

import os
from pathlib import Path

if not os.environ.get("VMI_CACHE_DIR"):
    os.environ["VMI_CACHE_DIR"] = str(Path(__file__).resolve().parent / ".cache" / "vmi")
