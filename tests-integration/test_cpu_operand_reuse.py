"""No cpu kernel reads a stale value through an operand variable of TVM's C code generator
(``source_checks.stale_operand_reuses``): the generator binds each min/max operand to a variable and
reuses it for the same text later in the block, even after a store to what it read. This made
per_block_cast_lossless with one input block per output block write SF 0 (its running maximum was read
as it was before the loop). Checked on every op's kernels at its default options and at the option
sets of its bench baselines, both flavors (slow); by default on the lossless kernel that had it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vmi_core.tools.registry import discover
from vmi_core.tools.source_checks import stale_operand_reuses

sys.path.insert(0, str(Path(__file__).parent))
from test_baselines import VARIANTS  # noqa: E402  (the option sets whose kernels differ)

OPS = discover()
DEFAULT = ("per_block_cast_lossless", ("x_block_m=32", "x_block_k=32", "out_block_m=32", "out_block_k=32"))
CASES = [*(pytest.param(name, tuple(pairs), flavor, marks=pytest.mark.slow)
           for name in sorted(OPS) for pairs in [[], *VARIANTS.get(name, [])] for flavor in ("ascend", "cuda")),
         pytest.param(*DEFAULT, "ascend", id="lossless-equal-blocks")]


@pytest.mark.parametrize(("name", "pairs", "flavor"), CASES)
def test_no_operand_is_read_after_a_store(name: str, pairs: tuple[str, ...], flavor: str) -> None:
    op = OPS[name]
    assert stale_operand_reuses(op.source(op.parse_options(list(pairs)), "cpu", flavor)) == []
