"""norm_forward and norm_forward_and_per_token_cast lower for ascend and cuda.

Ascend: the generated AscendC is one persistent kernel (work tiles of rows round-robin over the
64 vector cores), loads x (and the residual and weight rows) by DMA, runs the residual add, the
fixed-order square sums, the rstd, the normalisation and the quantisation in one SIMD region
(vector instructions only, no scalar UB access; the per-row rstd reaches its elements by a
broadcast load), the SF and Mega MoE scatter in one SIMT region (computed addresses: the README's
"differences by target" entry), no barrier inside a thread-guarded branch, and stores every
output row tile and the rstd by DMA. CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import re

import pytest

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_quant.kernels.norm_forward import build_norm_forward
from vmi_quant.ops.norm_forward import make_spec

EPS = 1e-6
# name -> (dtype, hidden, weight, residual, out_scale, cast options or None). The first two are
# kernels test_norm_forward runs (the cast one on ascend-sim too: its lowering is cached once).
SPECS = {
    "norm-bf16-weight-residual": ("bf16", 256, True, True, 0.3, None),
    "cast-packed-col-major-bf16-mega": ("bf16", 256, True, True, 0.3,
                                        dict(round_sf=True, col_major=True, packed=True, with_out_bf16=True,
                                             mega_moe_block_m=16)),
    "norm-fp32-tail": ("fp32", 200, False, False, 1.0, None),
    "cast-h7168-plain-sf": ("bf16", 7168, True, False, 1.0, {}),                    # 224 groups a row
    "cast-fp32-bf16-out": ("fp32", 640, True, False, 1.0, dict(with_out_bf16=True)),  # 20 groups a row
}


def _spec(name, flavor="ascend"):
    dtype, hidden, weight, residual, out_scale, cast = SPECS[name]
    return make_spec(dtype, hidden, EPS, get_flavor(flavor), out_scale, weight, residual, cast is not None,
                     **(cast or {}))


def _check_ascend(name):
    spec = _spec(name)
    src = build_norm_forward.source(spec, "ascend")
    assert "__global__ __vector__ void norm_forward_kernel" in src
    # assert_vector_regions also fails on a barrier inside a thread-guarded branch.
    regions = assert_vector_regions(src, simd=1, simt=int(spec.quant is not None))
    assert regions[0].vector_ops > 0 and regions[0].scalar_accesses == 0
    # Persistent: tile w * 64 + block_idx on each iteration.
    assert re.search(r"\(w \* 64\) \+ \(\(int32_t\)block_idx\)", src), "no persistent loop over the cores"
    gm_to_ub, ub_to_gm = dma_counts(src)
    assert gm_to_ub >= 1 + spec.has_residual + spec.has_weight
    stores = 2 + spec.has_residual + int(spec.quant is not None and spec.quant.with_out_bf16)
    assert ub_to_gm == stores, f"{ub_to_gm} DMA stores, expected {stores}"
    # The rstd reaches a row's elements by a broadcast load; square sums accumulate by vmula (fused
    # multiply-add); the rstd estimate takes the vector square root.
    for op in ("vlds_brc_elem", "vmula", "vsqrt", "vdintlv"):
        assert f"simd_inst::{op}" in src, f"no {op} in the SIMD region"


# Lowering for Ascend takes seconds a kernel: the default set lowers the one test_norm_forward runs
# on ascend-sim (every phase), the rest run under slow.
LOWERING = ["cast-packed-col-major-bf16-mega"]


@pytest.mark.parametrize("name", LOWERING)
def test_ascend_lowering(name):
    _check_ascend(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SPECS if n not in LOWERING])
def test_ascend_lowering_full(name):
    _check_ascend(name)


def _check_cuda(name):
    src = build_norm_forward.source(_spec(name, "cuda"), "cuda")
    assert_cuda_compiles(src, "norm_forward_kernel")


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_lowering_compiles():
    _check_cuda("norm-bf16-weight-residual")


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("name", [n for n in SPECS if n != "norm-bf16-weight-residual"])
def test_cuda_lowering_compiles_all(name):
    _check_cuda(name)
