"""Tensors past the kernels' 32-bit offsets are refused before any kernel runs, naming the argument.

Kernels address a tensor with 32-bit offsets from its first element (``vmi_core.checks.
check_kernel_extent``). The mHC ops take dense tensors, so the offset of the last element is the
size: each case gives one argument 2^31 or more elements along the token axis (every other
argument sized to match) and expects a ``ValueError`` naming it. The big tensors come from
``torch.empty``, which maps memory without touching it, so a case costs no memory and no time.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.checks import INT32_MAX
from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import (
    expand_to_mhc_bwd,
    expand_to_mhc_fwd,
    mhc_head_compute_mix_fwd,
    mhc_post_fwd,
    mhc_pre_apply_mix_bwd,
    mhc_pre_apply_mix_fwd,
    mhc_pre_norm_fn_gemm_fwd,
    mhc_pre_split_mixes_fwd,
    mhc_sinkhorn_fwd,
)

no_kernel = no_kernel_fixture(*(f"vmi_mhc.kernels.{name}" for name in (
    "expand", "head_compute_mix", "post", "pre_apply_mix", "pre_norm_fn_gemm", "pre_split_mixes", "sinkhorn")))

N, H = 4, 4096
BF16, F32 = torch.bfloat16, torch.float32


def tokens_past_limit(per_token: int) -> int:
    """Tokens of ``per_token`` elements each whose last element lies past offset 2^31 - 1."""
    return (INT32_MAX + 1) // per_token + 1


def empty(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype)


def _expand_fwd():
    t = tokens_past_limit(N * H)
    return lambda: expand_to_mhc_fwd(empty(t, H), empty(t, N, H)), "o"


def _expand_bwd():
    t = tokens_past_limit(N * H)
    return lambda: expand_to_mhc_bwd(empty(t, N, H), empty(t, H)), "o_grad"


def _apply_fwd():
    t = tokens_past_limit(N * H)
    return lambda: mhc_pre_apply_mix_fwd(empty(t, N, H), empty(t, N, dtype=F32), empty(t, H)), "x"


def _apply_bwd():
    t = tokens_past_limit(N * H)
    return lambda: mhc_pre_apply_mix_bwd(empty(t, H), empty(t, N, H), empty(t, N, dtype=F32), empty(t, N, H)), "x"


def _post_fwd():
    t = tokens_past_limit(N * H)
    return lambda: mhc_post_fwd(empty(1, t, H), empty(1, t, N, H), empty(1, t, N, 1, dtype=F32),
                                empty(1, t, N, N, dtype=F32)), "residual"


def _gemm_fwd():
    t = tokens_past_limit(N * H)
    return lambda: mhc_pre_norm_fn_gemm_fwd(empty(t, N * H), empty(N * (N + 2), N * H, dtype=F32)), "x"


def _sinkhorn_fwd():
    t = tokens_past_limit(N * N)
    return lambda: mhc_sinkhorn_fwd(empty(t, N, N, dtype=F32), None, 10, 1e-6), "comb_res_mix"


def _split_fwd():
    mix = N * (N + 2)
    t = tokens_past_limit(mix)
    return lambda: mhc_pre_split_mixes_fwd(empty(t, mix, dtype=F32), empty(3, dtype=F32), empty(mix, dtype=F32),
                                           None, None, None, 2.0, 1e-2), "input_mixes"


def _head_fwd():
    t = tokens_past_limit(N)
    return lambda: mhc_head_compute_mix_fwd(empty(t, N, dtype=F32), empty(1, dtype=F32), empty(N, dtype=F32), None,
                                            1e-2), "input_mix"


CASES = [_expand_fwd, _expand_bwd, _apply_fwd, _apply_bwd, _post_fwd, _gemm_fwd, _sinkhorn_fwd, _split_fwd, _head_fwd]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__.strip("_"))
def test_a_tensor_past_the_int32_offsets_is_refused(case):
    call, name = case()
    with pytest.raises(ValueError, match=rf"^{name} is too large for the kernels, which address a tensor with 32-bit"):
        call()
