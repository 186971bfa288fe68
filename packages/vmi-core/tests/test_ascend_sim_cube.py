"""ascend-sim's Cube unit: one T.gemm (``vmi_devkit.sim_kernels.cube_gemm``) lowered for ``ascend``
and run on the model, against torch.

``C = A · Bᵀ`` with m, n and k of several 16-row fractals each and all different, so a transposed
or misplaced fractal changes the result: bit for bit against the model's stated Mmad order (k
ascending, one fp32 rounding per addition, computed by torch) and within the fp32 sum bound of a
float64 product. The negative controls break the emitted source (an NZ stride of the load, the
NZ -> ND store, the MTE2 -> MTE1 wait, an L1 address past the 512 KiB of L1) under every schedule:
an error or wrong data. The controls are ``slow`` (each builds a simulator; vmi-mhc's prenorm
GEMM tests run a Cube-model control by default).
"""

import pytest
import torch

from vmi_core.ascend_sim import AscendSimError, SimKernel, launch_shape
from vmi_core.compile import cache_dir, lower_artifact
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.sim_kernels import build_cube_gemm, cube_gemm, cube_gemm_reference

SHAPE = (48, 32, 96)  # m, n, k: 3, 2 and 6 fractals
U = 2.0**-24


def _operands(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, n, k = SHAPE
    g = generator(seed)
    return torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()


@pytest.mark.parametrize("schedule", [s if s == "random" else pytest.param(s, marks=pytest.mark.slow)
                                      for s in SIM_SCHEDULES])
def test_gemm_matches_torch(schedule):
    a, b = _operands(1)
    with sim_schedule(schedule):
        c = cube_gemm(a, b, "ascend-sim")
    assert_bitwise_equal(c, cube_gemm_reference(a, b), f"C [{schedule}]")
    exact = a.double() @ b.double().T
    k = SHAPE[2]
    bound = (k - 1) * U / (1 - (k - 1) * U) * (a.double().abs() @ b.double().abs().T)
    assert ((c.double() - exact).abs() <= bound).all()
    assert not torch.equal(c.double(), exact), "sums without rounding test no order"


def _replace_once(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"expected exactly one {old!r} in the source"
    return source.replace(old, new)


# name -> how the emitted source is broken
MUTATIONS = {
    # A's NZ layout in L1 with its C0 columns 32 rows apart instead of 48
    "A in L1 with the wrong C0 stride": lambda s: _replace_once(
        s, "asc_set_gm2l1_nz_para(1, 1, static_cast<uint16_t>(48), 0);",
        "asc_set_gm2l1_nz_para(1, 1, static_cast<uint16_t>(32), 0);"),
    # the accumulator read as if its column blocks were 32 rows apart instead of 48
    "L0C stored with the wrong source stride": lambda s: _replace_once(s, "32, 48, 32, 48,", "32, 48, 32, 32,"),
    "drop the MTE2 -> MTE1 wait": lambda s: _replace_once(
        s, "asc_sync_wait(PIPE_MTE2, PIPE_MTE1, static_cast<event_t>(0));\n", ""),
    "B past the end of L1": lambda s: _replace_once(
        s, "((__cbuf__ bfloat16_t*)buf_dyn_l1 + 4608), (&(B[0]))",
        "((__cbuf__ bfloat16_t*)buf_dyn_l1 + 262144), (&(B[0]))"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_negative_controls_are_reported(mutation):
    func = build_cube_gemm(SHAPE, "ascend")
    artifact = lower_artifact(func, "ascend")
    source = artifact.kernel_source
    assert "__cube__ void cube_gemm_kernel" in source
    broken = MUTATIONS[mutation](source)
    cores, ub_bytes = launch_shape(artifact.device_mod)
    kernel = SimKernel(func, broken, cores, ub_bytes, cache_dir() / "ascend-sim")
    a, b = _operands(2)
    for schedule in SIM_SCHEDULES:
        c = torch.full((SHAPE[0], SHAPE[1]), float("nan"))
        with sim_schedule(schedule):
            try:
                kernel(a, b, c)
            except AscendSimError as error:
                assert "cube_gemm_kernel" in str(error) and "(AIC)" in str(error)
                continue
        assert not torch.equal(c, cube_gemm_reference(a, b)), f"{mutation!r} went unnoticed under {schedule}"
