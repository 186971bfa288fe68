"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops, ``(tokens,)`` for the mix ops; the stream count is 4.
"""

from __future__ import annotations

OPS = []
