"""The cpu element loops that evaluate ``exp`` (a call of ``vmi_exp``, or of the fast pass of ``Shell.exp``,
which marks the lanes it cannot decide: ``vmi_core.tl.elementary``, inlined by GCC) vectorize, in
every op whose exp runs per element: GCC's vectorizer report on the op's cpu kernel at its default
options, both flavors (the ascend flavor adds the Ascend division to the loop). The default run checks
one; the slow run all.

Not vectorized, and not listed: the MoE gate (its exp feeds a per-token top-k selection).
"""

from __future__ import annotations

import re

import pytest

from vmi_core.tools.registry import discover
from vmi_core.tools.source_checks import cpu_loop_vectorizes

# The calls of vmi_exp and vmi_exp_fast_or_mark (the kernel's loops; the functions' own lines are in none).
EXP_MARKER = "vmi_exp"
OPS = ["swiglu_forward", "swiglu_forward_and_per_token_cast", "swiglu_backward", "swiglu_backward_and_per_token_cast",
       "mhc_pre_split_mixes_fwd", "mhc_pre_split_mixes_bwd", "mhc_head_compute_mix_fwd", "mhc_head_compute_mix_bwd",
       "mhc_pre_big_fuse_fwd", "mhc_sinkhorn_fwd", "mhc_sinkhorn_bwd",
       "swiglu_forward_and_per_channel_cast_and_transpose"]
CASES = [pytest.param(op, flavor, marks=[] if (op, flavor) == ("swiglu_forward", "ascend") else pytest.mark.slow)
         for op in OPS for flavor in ("ascend", "cuda")]


@pytest.mark.parametrize(("name", "flavor"), CASES)
def test_the_exp_loop_vectorizes(name: str, flavor: str) -> None:
    op = discover()[name]
    source = op.source({o.name: o.default for o in op.options}, "cpu", flavor)
    kernels = ["// " + k for k in re.split(r"^// vmi source: ", source, flags=re.MULTILINE)[1:] if EXP_MARKER in k]
    assert kernels, f"{name} has no exp loop"
    for kernel in kernels:
        vectorized = cpu_loop_vectorizes(kernel, EXP_MARKER)
        if vectorized is None:
            pytest.skip("the host C++ compiler is not GCC")
        assert vectorized, kernel.splitlines()[0]
