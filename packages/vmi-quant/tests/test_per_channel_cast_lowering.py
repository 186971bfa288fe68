"""per_channel_cast lowers for ascend and cuda.

Ascend: the generated AscendC loads the tile by DMA, runs one SIMD region per work tile (real
vector instructions, no scalar UB access: the column amax, scales and quantization), a SIMT region
for the input SF of a pre-quantized input and one for UE8M0 bytes packed along the tokens (computed
addresses: the README's "differences by target" entry), no barrier inside a thread-guarded
branch, and stores the data tile and an fp32 SF tile by DMA. CUDA: the source compiles with nvcc
for an explicit arch.
"""

from __future__ import annotations

from vmi_core.targets import get_flavor
from vmi_devkit.cases.pcc_cases import COVERING, CUDA_LOWERING, IN_SF, LOWERING, OUT_SF, case_id
from vmi_devkit.lowering import assert_ascend_kernel, assert_cuda_compiles, case_table_tests
from vmi_quant.kernels.per_channel_cast import build_per_channel_cast
from vmi_quant.ops.per_channel_cast import make_spec
from vmi_quant.sf_layout import SFLayout


def _spec(in_dtype, npc, in_sf, npt, out_sf, flavor):
    flavor = get_flavor(flavor)
    round_sf, packed = OUT_SF[out_sf]
    in_layout = None
    if in_sf is not None:
        options = IN_SF[in_sf]
        in_layout = SFLayout.of(flavor, packed=options.get("use_packed_ue8m0", False),
                                e4m3=options.get("use_e4m3_sf", False),
                                col_major=options.get("use_tma_aligned_col_major_sf", False), block_k=npc)
    return make_spec(in_dtype, npt, round_sf, SFLayout.of(flavor, packed=packed, block_k=1), in_layout, npc)


def _check_ascend(case):
    spec = _spec(*case)
    src = build_per_channel_cast.source(spec, "ascend")
    packed = spec.sf_layout.kind == "ue8m0"
    # In: the data tile. Out: the data tile, and the fp32 SF tile unless packed bytes are stored.
    assert_ascend_kernel(src, "per_channel_cast_kernel", simd=1,
                         simt=int(packed) + int(spec.in_sf_layout is not None), dma=(1, 1 if packed else 2))


def _check_cuda(case):
    assert_cuda_compiles(build_per_channel_cast.source(_spec(*case), "cuda"), "per_channel_cast_kernel")


(test_ascend_lowering, test_ascend_lowering_full,
 test_cuda_lowering_compiles, test_cuda_lowering_compiles_all) = case_table_tests(
    _check_ascend, _check_cuda, covering=COVERING, lowering=LOWERING, cuda_lowering=CUDA_LOWERING, ids=case_id,
    cuda_slow=True)
