"""The source checkers (vmi_core.tools.source_checks) on hand-written AscendC-like snippets.

Real generated sources are checked in test_compile.py and test_reduce.py; these
snippets pin down the parsing (brace matching, comments, literals, declarations).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from vmi_core.tools.source_checks import (
    Region,
    assert_vector_regions,
    barriers_in_thread_guards,
    cuda_shared_memory_problems,
    dma_counts,
    nvcc_compile,
    nvcc_path,
    region_report,
)

SIMD_OK = """\
__simd_vf__ inline void k_kernel_simd_vf_0(__ubuf__ uint8_t* buf) {
  for (int32_t v = 0; v < 16; ++v) {
    vector_bool mask = asc_create_mask_b32(PAT_ALL);
    auto vreg_0 = simd_inst::vlds_norm<float>((__ubuf__ float*)(&(((__ubuf__ float*)buf)[(v * 64)])), 0);
    auto vreg_1 = simd_inst::vdup<float>(float(0x1.8p+1f/*3.000000e+00*/), mask, MODE_ZEROING);
    auto vreg_2 = simd_inst::vmul(vreg_0, vreg_1, mask, MODE_ZEROING);
    simd_inst::vsts_norm(vreg_2, (__ubuf__ float*)(&(((__ubuf__ float*)buf)[((v * 64) + 1024)])), 0, mask);
  }
}
"""

SIMD_SCALAR = """\
__simd_vf__ inline void k_kernel_simd_vf_1(__ubuf__ uint8_t* buf_dyn_shmem) {
  for (int32_t i = 0; i < 16; ++i) {
    for (int32_t j = 0; j < 64; ++j) {
      auto v = ((__ubuf__ float*)buf_dyn_shmem)[((i * 64) + j)];
      ((__ubuf__ float*)buf_dyn_shmem)[(((i * 64) + j) + 2048)] = (v * 2.0f);
    }
  }
}
"""

SIMT = """\
__simt_vf__ __launch_bounds__(128) inline void k_kernel_simt_vf_0(__ubuf__ uint8_t* buf, int32_t n) {
  if (((int32_t)threadIdx.x) < n) { /* a brace in a comment: { */
    const char* s = "}";  // and in a string
    ((__ubuf__ float*)buf)[((int32_t)threadIdx.x)] = 1.0f;
  }
}
"""

HOST = """\
extern "C" __global__ __vector__ void k_kernel(__gm__ float* X, __gm__ float* Y, int32_t M) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align((__ubuf__ uint8_t*)buf_dyn_shmem, (__gm__ uint8_t*)X, 1, 256, 0, 0, 0);
  {calls}
  asc_copy_ub2gm_align((__gm__ uint8_t*)Y, (__ubuf__ uint8_t*)buf_dyn_shmem, 1, 256, 4, 256, 256);
  asc_copy_ub2gm_align((__gm__ uint8_t*)Y, (__ubuf__ uint8_t*)buf_dyn_shmem, 1, 256, 4, 256, 256);
}}
"""


def source(*regions: str, calls: str = "") -> str:
    return "#include <tl_templates/ascend/common.h>\n" + "\n".join(regions) + "\n" + \
        HOST.replace("{calls}", calls).replace("}}\n", "}\n")


SIMD_CALL = "k_kernel_simd_vf_0(buf_dyn_shmem);"
SIMT_CALL = "asc_vf_call<k_kernel_simt_vf_0>(cce::dim3(128), buf_dyn_shmem, M);"


def test_region_report():
    src = source(SIMD_OK, SIMT, SIMD_SCALAR, calls=SIMD_CALL + SIMT_CALL)
    assert region_report(src) == [
        Region("k_kernel_simd_vf_0", "simd", 4, 0),
        Region("k_kernel_simt_vf_0", "simt", 0, 1),
        Region("k_kernel_simd_vf_1", "simd", 0, 2),
    ]


def test_braces_in_comments_and_strings_do_not_end_a_body():
    (region,) = region_report(SIMT)
    assert region.scalar_accesses == 1  # the store after the string literal is inside the body


def test_declarations_are_not_regions():
    src = "__simd_vf__ inline void k_kernel_simd_vf_0(__ubuf__ uint8_t* buf);\n" + SIMD_OK
    assert [r.name for r in region_report(src)] == ["k_kernel_simd_vf_0"]


def test_no_regions():
    assert region_report(source()) == []
    with pytest.raises(AssertionError, match="no vector region found"):
        assert_vector_regions(source())
    assert_vector_regions(source(), simd=0, simt=0)


def test_assert_vector_regions_passes():
    src = source(SIMD_OK, SIMT, calls=SIMD_CALL + SIMT_CALL)
    regions = assert_vector_regions(src, simd=1, simt=1)
    assert [r.kind for r in regions] == ["simd", "simt"]


def test_scalar_simd_region_fails_with_report():
    src = source(SIMD_SCALAR, calls="k_kernel_simd_vf_1(buf_dyn_shmem);")
    with pytest.raises(AssertionError) as info:
        assert_vector_regions(src)
    message = str(info.value)
    assert "SIMD region k_kernel_simd_vf_1 is scalar code (0 vector ops, 2 scalar accesses)" in message
    assert "simd k_kernel_simd_vf_1: 0 vector ops, 2 scalar accesses" in message


def test_counts():
    src = source(SIMD_OK, SIMT, calls=SIMD_CALL + SIMT_CALL)
    with pytest.raises(AssertionError, match=r"expected 2 simd region\(s\), found 1"):
        assert_vector_regions(src, simd=2)
    with pytest.raises(AssertionError, match=r"expected 0 simt region\(s\), found 1"):
        assert_vector_regions(src, simt=0)


def test_regions_must_be_launched():
    with pytest.raises(AssertionError, match="never launched with asc_vf_call<k_kernel_simt_vf_0>"):
        assert_vector_regions(source(SIMT, calls="k_kernel_simt_vf_0(buf_dyn_shmem, M);"))
    with pytest.raises(AssertionError, match="k_kernel_simd_vf_0 is never called"):
        assert_vector_regions(source(SIMD_OK))


def test_dma_counts():
    assert dma_counts(source()) == (1, 2)
    assert dma_counts("") == (0, 0)


def test_nvcc_bad_arch():
    with pytest.raises(ValueError, match="sm_90a"):
        nvcc_compile("", "hopper")


@pytest.mark.cuda_compile
def test_nvcc_failure_reports_stderr():
    if nvcc_path() is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed: the CUDA source is generated but cannot be compiled here")
    with pytest.raises(AssertionError, match=r"(?s)nvcc failed \(exit \d+\) for arch sm_80:.*vmi_no_such"):
        nvcc_compile("__global__ void k() { vmi_no_such_type x; }\n", "sm_80")


GUARDED = """\
__simt_vf__ __launch_bounds__(128) inline void k_simt_vf_0(__ubuf__ uint8_t* buf) {
  asc_syncthreads();
  if (((int32_t)threadIdx.x) < 32) {
    for (int32_t j = 0; j < 8; ++j) {
      if (buf[j] != 0) { buf[j] = 1; }
      asc_syncthreads();
    }
  }
  asc_syncthreads();
  if ((((int)threadIdx.x) < 16)) {
    __syncthreads();
  }
}
"""


def test_barriers_in_thread_guards():
    # The two inside the guards count; the ones between them do not.
    assert barriers_in_thread_guards(GUARDED) == 2
    assert barriers_in_thread_guards(GUARDED.replace("      asc_syncthreads();\n", "")) == 1
    assert barriers_in_thread_guards("if (x < 3) { __syncthreads(); }") == 0
    with pytest.raises(AssertionError, match="2 barrier"):
        assert_vector_regions(GUARDED.replace("{\n  asc_syncthreads();", "{", 1) + "asc_vf_call<k_simt_vf_0>(1);")


def test_the_cuda_build_does_not_contract_a_product_and_a_sum():
    """nvcc fuses ``a * b + c`` into one FMA by default; vmi's cuda build (``CUDA_COMPILE_FLAGS``, the
    pass configs' device flags and the library build's) rounds both, as the cpu build and the
    references do. The control shows this nvcc does contract without the flags."""
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    from vmi_core.compile import CUDA_COMPILE_FLAGS, pass_configs

    assert pass_configs("cuda")["tl.device_compile_flags"] == list(CUDA_COMPILE_FLAGS)
    src = 'extern "C" __global__ void k(float* y, const float* a, const float* b, const float* c) {\n' \
          "  y[0] = a[0] * b[0] + c[0];\n}\n"

    def ptx(*flags: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            cu = Path(tmp) / "k.cu"
            cu.write_text(src)
            subprocess.run([nvcc, "--ptx", "-arch=sm_90", *flags, str(cu), "-o", str(Path(tmp) / "k.ptx")], check=True)
            return (Path(tmp) / "k.ptx").read_text()

    assert "fma.rn.f32" in ptx()
    built = ptx(*CUDA_COMPILE_FLAGS)
    assert "fma.rn.f32" not in built and "mul.rn.f32" in built and "add.rn.f32" in built


_DYNAMIC = """extern __shared__ __align__(1024) uchar buf_dyn_shmem[];
  void* x = ((void*)((char*)buf_dyn_shmem + 0));
  void* q = ((void*)((char*)buf_dyn_shmem + {q}));
  tl::tma_store(OUT_desc, (&(((uchar*)q)[{index}])), k0, row0);
  tl::tma_store((&(G[0])), (&(((float*)x)[(i * 4)])), 64);
"""


@pytest.mark.parametrize(("q", "index", "problem"), [
    (8192, "0", None),
    (8320, "(i_3 * 128)", None),
    (8256, "0", "TMA tile q at shared offset 8256 is not 128-byte aligned"),
    (8192, "(i_3 * 64)", "TMA box q[(i_3 * 64)] is not 128-byte aligned"),
    (8192, "k", "TMA box q[k] is not 128-byte aligned"),
])
def test_tma_tiles_must_sit_at_their_alignment(q, index, problem):
    # The descriptor-free bulk copy of x (16 bytes a step) needs only 16-byte alignment.
    problems = cuda_shared_memory_problems(_DYNAMIC.format(q=q, index=index))
    assert problems == ([] if problem is None else [f"line 4: {problem}"])


def test_static_shared_arrays_are_flagged_as_tma_tiles_and_over_48_kb():
    src = ("__shared__ __align__(16) float x[12288];\n__shared__ __align__(16) uchar q[4096];\n"
           "tl::tma_store(OUT_desc, (&(q[0])), k0, row0);\n")
    assert cuda_shared_memory_problems(src) == [
        "53248 bytes of static shared memory (over 49152)",
        "line 3: TMA tile q is a static shared array (alignment not guaranteed)"]
    assert cuda_shared_memory_problems("__shared__ __align__(16) float x[12288];\n") == []
