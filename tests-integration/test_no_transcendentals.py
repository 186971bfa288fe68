"""No op's kernel calls a hardware or library transcendental on any target: the exps and logs are
vmi-core's correctly rounded functions of fp32 and integer arithmetic (``vmi_core.tl.elementary``),
so no result rests on the undocumented bits of the Ascend vector unit's ``vexp``/``vln`` or a libm.
Checked on every op's kernels at their default options and at the option sets of their bench
baselines, on every target (slow: an Ascend lowering each; by default the ops' lowering tests check
the exp-using kernels they lower).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vmi_core.tools.registry import discover
from vmi_core.tools.source_checks import transcendental_calls

sys.path.insert(0, str(Path(__file__).parent))
from test_baselines import VARIANTS  # noqa: E402  (the option sets whose kernels differ)

OPS = discover()
# (op, options, the target whose source is read: lowering needs no device)
CASES = [pytest.param(name, tuple(pairs), lowered, id=f"{name}-{','.join(pairs) or 'default'}-{lowered}")
         for name in sorted(OPS) for pairs in [[], *VARIANTS.get(name, [])] for lowered in ("ascend", "cuda", "cpu")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "pairs", "lowered"), CASES)
def test_no_kernel_calls_a_transcendental(name: str, pairs: tuple[str, ...], lowered: str) -> None:
    op = OPS[name]
    flavor = "ascend" if lowered == "ascend" else "cuda"
    assert transcendental_calls(op.source(op.parse_options(list(pairs)), lowered, flavor)) == []
