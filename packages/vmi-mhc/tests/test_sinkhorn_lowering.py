"""mhc_sinkhorn_fwd and mhc_sinkhorn_bwd lower for ascend and cuda.

Ascend (ascend flavor, the only one that target runs): each kernel is two SIMD regions (64 tokens a
register, one per lane) around one SIMT region, the softmax's exps (vmi's correctly rounded exp, a
function of scalar lanes; no hardware transcendental); the 16 entries of the tokens' matrices are
gathered from UB once per phase (logits, their exps, and in the backward the output gradients)
and the results scattered back once per phase (the exps' arguments, the results); the backward's
replay store is written and read as whole registers (16 entries and 4 denominators per step and
the softmax output), with a vector memory barrier between the replay and the reverse walk; DMA in
and out; persistent scheduling over the vector cores (``block_idx``); the normalisations run in a
loop over the runtime ``2 * repeat - 1`` steps, not unrolled. CUDA (cuda flavor): the source
compiles with nvcc for an explicit arch, where nvcc is installed. The default run checks the
backward's Ascend source; the slow run the others and both CUDA sources.
"""

import pytest

from vmi_core.tools.source_checks import (
    assert_vector_regions,
    barriers_in_thread_guards,
    dma_counts,
    transcendental_calls,
)
from vmi_devkit.cuda import check_cuda_source
from vmi_mhc.kernels.sinkhorn import SinkhornSpec, build_sinkhorn_backward, build_sinkhorn_forward
from vmi_mhc.tl.sinkhorn import ENTRIES, N

# (source, kernel name, (GM->UB, UB->GM) copies, gathered tiles)
KERNELS = {
    "forward": (build_sinkhorn_forward.source, "sinkhorn_forward_kernel", (1, 1), 2),
    "backward": (build_sinkhorn_backward.source, "sinkhorn_backward_kernel", (2, 1), 3),
}


# The backward by default (the default ascend-sim case lowers it too, into the same cache entry);
# the forward in the slow run.
@pytest.mark.parametrize("direction", [pytest.param("forward", marks=pytest.mark.slow), "backward"])
def test_ascend_lowering(direction: str) -> None:
    source, kernel, dma, gathered = KERNELS[direction]
    src = source(SinkhornSpec("ascend"), "ascend")
    assert f"__global__ __vector__ void {kernel}" in src
    assert_vector_regions(src, simd=2, simt=1)
    assert transcendental_calls(src) == [] and "vmi_exp(" in src
    assert barriers_in_thread_guards(src) == 0
    assert dma_counts(src) == dma
    assert "block_idx" in src
    assert src.count("vgather2(") == gathered * ENTRIES
    assert src.count("vscatter(") == 2 * ENTRIES
    assert "((repeat * 2) - 1)" in src
    if direction == "backward":
        # The replay stores a step's 16 entries and 4 denominators (and the softmax output once); the
        # reverse walk loads them back.
        whole_registers = 2 * ENTRIES + N
        assert src.count("simd_inst::vsts_norm(") == whole_registers
        assert src.count("simd_inst::vlds_norm<float>(") == whole_registers
        last_store, first_load = src.rindex("simd_inst::vsts_norm("), src.index("simd_inst::vlds_norm<float>(")
        assert last_store < first_load
        assert "mem_bar(VV_ALL)" in src[last_store:first_load]


# In the slow run: nvcc takes ten seconds for the forward, half a minute for the backward (twice the source).
@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("direction", ["forward", pytest.param("backward", marks=pytest.mark.slow)])
def test_cuda_lowering_compiles(direction: str) -> None:
    source, kernel, _, _ = KERNELS[direction]
    src = source(SinkhornSpec("cuda"), "cuda")
    assert "__global__ void" in src and kernel in src
    assert barriers_in_thread_guards(src) == 0
    check_cuda_source(src)
