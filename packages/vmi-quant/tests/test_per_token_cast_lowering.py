"""per_token_cast lowers for ascend and cuda in every supported configuration.

Ascend: the generated AscendC has DMA in and out and exactly the vector regions the
README's "differences by target" table lists: for plain inputs, one SIMD region (real
vector instructions, no scalar UB access) and one SIMT region for the SF at computed
addresses; otherwise one SIMT region per work tile. CUDA: the source
compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import assert_vector_regions, cpu_vectorized_loops, dma_counts
from vmi_devkit.cases.ptc_cases import COVERING, FULL, SF_MODES
from vmi_devkit.cuda import check_cuda_source
from vmi_quant.kernels.per_token_cast import QuantInput, build_per_token_cast
from vmi_quant.ops.per_token_cast import PerTokenCastOptions, make_spec
from vmi_quant.options import SFOptions
from vmi_quant.sf_layout import SFLayout


def _spec(in_dtype, fmt, npc, sf_mode, col_major, flavor, mode="cast", stochastic=False, quant_input=None):
    round_sf, packed, e4m3_sf = SF_MODES[sf_mode]
    layout = SFLayout.of(get_flavor(flavor), packed=packed, e4m3=e4m3_sf, col_major=col_major)
    options = PerTokenCastOptions(fmt, npc, sf=SFOptions(col_major, round_sf, packed, e4m3_sf),
                                  stochastic_cast=stochastic, mode=mode)
    return make_spec(in_dtype, options, layout, quant_input)


def _quant_input(flavor, in_sf_mode, x_block, col_major=False):
    fl = get_flavor(flavor)
    layout = SFLayout.of(fl, packed=in_sf_mode == "packed", e4m3=in_sf_mode == "e4m3", col_major=col_major,
                         block_k=x_block[1])
    return QuantInput(layout, *x_block, dequant_first=fl.dequant_before_scale)


def expected_regions(spec) -> dict:
    """Plain inputs: scales and data in one SIMD region, the SF read or written at computed
    addresses in one SIMT region; quantized inputs: one SIMT region."""
    vector = spec.quant_input is None
    return dict(simd=1 if vector else 0, simt=1)


EXTRA = [
    ("sr-e4m3", _spec("bf16", "e4m3", 32, "fp32", False, "ascend", stochastic=True)),
    ("sr-e2m1", _spec("fp32", "e2m1", 16, "pow2", False, "ascend", stochastic=True)),
    ("sf-only", _spec("bf16", "e4m3", 32, "packed", True, "ascend", mode="sf_only")),
    ("cast-only", _spec("bf16", "e2m1", 32, "e4m3", False, "ascend", mode="cast_only")),
    ("e4m3-in", _spec("e4m3", "e4m3", 32, "fp32", False, "ascend",
                      quant_input=_quant_input("ascend", "fp32", (32, 32)))),
    ("e2m1-in-packed-col", _spec("e2m1", "e2m1", 32, "pow2", False, "ascend",
                                 quant_input=_quant_input("ascend", "packed", (32, 32), col_major=True))),
    ("e4m3-in-e4m3-sf", _spec("e4m3", "e2m1", 128, "fp32", False, "cuda",
                              quant_input=_quant_input("cuda", "e4m3", (128, 128)))),
]
ASCEND_CASES = [("-".join(map(str, c)), _spec(*c)) for c in COVERING] + EXTRA
# The default run lowers one plain-input and one quantized-input kernel (each lowering takes
# seconds); the other cases, and the cuda-flavor ones the ascend target never runs, in the slow run.
DEFAULT_ASCEND_CASES = {ASCEND_CASES[0][0], "e4m3-in"}
ASCEND_PARAMS = [pytest.param(name, spec, id=name, marks=[] if name in DEFAULT_ASCEND_CASES else [pytest.mark.slow])
                 for name, spec in ASCEND_CASES]


@pytest.mark.parametrize("name,spec", ASCEND_PARAMS)
def test_ascend_lowering(name, spec):
    src = build_per_token_cast.source(spec, "ascend")
    assert "__global__ __vector__ void per_token_cast_kernel" in src
    assert_vector_regions(src, **expected_regions(spec))
    gm_to_ub, ub_to_gm = dma_counts(src)
    assert gm_to_ub >= 1, "the input tile is not loaded by DMA"
    if spec.mode == "sf_only":
        assert ub_to_gm == 0
    else:
        assert ub_to_gm >= 1, "the data tile is not stored by DMA"
    # Persistent scheduling over the vector cores, 1-D core grid.
    assert "block_idx" in src


# The ascend target always runs the ascend flavor.
ASCEND_FULL = [case for case in FULL if case[5] == "ascend"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ASCEND_FULL, ids=lambda c: "-".join(map(str, c)))
def test_ascend_lowering_full(case):
    spec = _spec(*case)
    assert_vector_regions(build_per_token_cast.source(spec, "ascend"), **expected_regions(spec))


# One nvcc compile by default (a plain kernel); the rest in the slow run.
CUDA_CASES = [ASCEND_CASES[i] for i in (0, 3, 7, 10)] + [EXTRA[0], EXTRA[5]]
CUDA_PARAMS = [pytest.param(name, spec, id=name, marks=[] if i == 0 else [pytest.mark.slow])
               for i, (name, spec) in enumerate(CUDA_CASES)]


@pytest.mark.cuda_compile
@pytest.mark.parametrize("name,spec", CUDA_PARAMS)
def test_cuda_lowering_compiles(name, spec):
    src = build_per_token_cast.source(spec, "cuda")
    assert "__global__ void" in src and "per_token_cast_kernel" in src
    check_cuda_source(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("name,spec", ASCEND_CASES, ids=[n for n, _ in ASCEND_CASES])
def test_cuda_lowering_compiles_all(name, spec):
    src = build_per_token_cast.source(spec, "cuda")
    check_cuda_source(src)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cpu_phases_vectorize(fmt):
    """The cpu build vectorizes the amax reduction and the encode loop over the tile (their speed
    rests on it: a change to the encoders, the copies or the flags that makes GCC give up shows here)."""
    loops = cpu_vectorized_loops(build_per_token_cast.source(_spec("bf16", fmt, 32, "fp32", False, "ascend"), "cpu"))
    if loops is None:
        pytest.skip("the host C++ compiler is not GCC")
    report = "\n".join(loops)
    assert any("running" in loop for loop in loops), f"the amax reduction does not vectorize:\n{report}"
    # The encode loop runs over the tile's elements (pairs of them for E2M1); nothing else of the
    # full-tile path is that long.
    length = 4096 if fmt == "e4m3" else 2048
    assert any(f"< {length};" in loop for loop in loops), f"the encode loop does not vectorize:\n{report}"
