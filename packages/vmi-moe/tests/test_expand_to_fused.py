"""expand_to_fused and expand_to_fused_with_sf: the kernel against the reference bit for bit, their
errors, and their lowering.

Kernel runs: ``cpu`` in both flavors and ascend-sim (the emitted AscendC on vmi-core's model of the
vector core), outputs compared with ``assert_bitwise_equal`` (dtype, shape, strides, bits; a
column-major SF also by its whole buffer, alignment rows included). Inputs are
``get_fused_mapping`` layouts (the reference ``vmi_moe.reference.mapping``) of random routings with
unused slots, and rows past the layout (trailing padding); data with NaN payloads and -0.0 (bits
must survive). Token counts cover none, one, a partial work tile, several tiles, cpu threads and,
on ascend-sim, more tiles than twice the simulated cores (buffer versions reused) under the pipe
schedules. Independently of the reference: every non-padding row equals its token's row, padding
rows are zero bits.

Compile budget: the default run builds one kernel per target for K = 8 and 4-byte words, which
both ops share (``ExpandSpec(8, 4)``: every row of an even-width bf16 / fp32 and every fp32 or
int32 SF), plus the byte-word kernel on cpu (an fp8 row of odd width); 2-byte words (bf16 rows of
odd width, int16 SF) and other K in the slow run.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, row_ranges
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import FLAVORS, SIM, SIM_CORES, flavor_targets
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.errors import no_kernel_fixture
from vmi_moe.kernels.expand_to_fused import BLOCK_M, ExpandSpec, build_expand_to_fused
from vmi_moe.ops.expand_to_fused import (
    expand_to_fused,
    expand_to_fused_parallel,
    expand_to_fused_with_sf,
    expand_to_fused_with_sf_parallel,
)
from vmi_moe.reference import expand as reference
from vmi_moe.reference.mapping import get_fused_mapping

K = 8
E = 12
ALIGN = 16
META = torch.device("meta")


# --- inputs --------------------------------------------------------------------------------------

def mapping(num_tokens: int, seed: int, *, k: int = K, experts: int = E, extra: int = 5, alignment: int = ALIGN,
            unused: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_topk_to_pos, pos_to_expert)`` of a random routing (distinct experts per token, a fraction
    of unused slots), laid out with ``extra`` padding rows past the last expert's range."""
    g = generator(seed)
    idx = torch.rand(num_tokens, experts, generator=g).argsort(dim=1)[:, :k]
    idx[torch.rand(num_tokens, k, generator=g) < unused] = -1
    counts = torch.bincount(idx[idx >= 0], minlength=experts)
    needed = int((-(-counts // alignment)).sum()) * alignment
    pte, _, _, pos, _, _, _ = get_fused_mapping(idx, experts, needed + extra, alignment)
    return pos.contiguous(), pte.contiguous()


def data(num_tokens: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows with NaN payloads and -0.0 in them (bit patterns the copy must keep)."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]
    info = torch.iinfo(bits)
    x = torch.randint(info.min, info.max, (num_tokens, hidden), generator=generator(seed),
                      dtype=torch.int64).to(bits).view(dtype)
    if x.numel():
        x.view(-1)[::7] = -0.0
    return x.contiguous()


def sf_grid(num_tokens: int, hidden_sf: int, dtype: torch.dtype, seed: int, col_major: bool) -> torch.Tensor:
    sf = data(num_tokens, hidden_sf, dtype, seed) if dtype != torch.float32 else \
        torch.exp2(torch.randint(-30, 30, (num_tokens, hidden_sf), generator=generator(seed)).float())
    # Column-major as per_token_cast lays it out (the transposed view of a [hidden_sf, T] buffer).
    return sf.t().contiguous().t() if col_major else sf


def sf_buffer(sf: torch.Tensor) -> torch.Tensor:
    """The whole buffer of a column-major SF view (alignment rows included), or the SF itself."""
    if sf.stride(0) == 1 and sf.dim() == 2 and sf.shape[1] and sf.stride(1) != 1:
        return torch.as_strided(sf, (sf.shape[1], sf.stride(1)), (sf.stride(1), 1))
    return sf


def assert_layout(out: torch.Tensor, x: torch.Tensor, pos: torch.Tensor, pte: torch.Tensor, what: str) -> None:
    """Reference-free: each placed slot's row is its token's row, every padding row is zero bits."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    tokens, slots = torch.nonzero(pos >= 0, as_tuple=True)
    assert torch.equal(out.view(bits)[pos[tokens, slots].long()], x.view(bits)[tokens]), f"{what}: placed rows"
    assert bool((out.view(bits)[pte < 0] == 0).all()), f"{what}: padding rows"


def check_expand(x, pos, pte, target, flavor, what):
    out = expand_to_fused(x, pos, pte, target=target, flavor=flavor)
    assert_bitwise_equal(out, reference.expand_to_fused(x, pos, pte), what)
    assert_layout(out, x, pos, pte, what)
    return out


def check_with_sf(x, sf, npc, pos, pte, col_major, target, flavor, what):
    out, out_sf = expand_to_fused_with_sf((x, sf), npc, pos, pte, col_major, target=target, flavor=flavor)
    ref, ref_sf = expand_to_fused_with_sf((x, sf), npc, pos, pte, col_major, target="torch", flavor=flavor)
    assert_bitwise_equal(out, ref, f"{what} data")
    assert_bitwise_equal(out_sf, ref_sf, f"{what} sf")
    assert_bitwise_equal(sf_buffer(out_sf), sf_buffer(ref_sf), f"{what} sf buffer")
    assert_layout(out, x, pos, pte, what)
    assert_layout(out_sf, sf, pos, pte, f"{what} sf")
    return out, out_sf


# --- against the reference -------------------------------------------------------------------------

# (tokens, hidden, dtype): none, one, a partial tile, rows in three chunks of 2 KiB (fp32 H = 1100), an
# odd fp32 width, several tiles.
CASES = [(0, 64, torch.bfloat16), (1, 64, torch.bfloat16), (13, 1100, torch.float32), (40, 37, torch.float32),
         (300, 256, torch.bfloat16), (70, 96, torch.float8_e5m2), (33, 64, torch.float16)]


@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
def test_matches_reference(flavor: str, target: str) -> None:
    for seed, (T, H, dtype) in enumerate(CASES):
        pos, pte = mapping(T, seed)
        x = data(T, H, dtype, seed)
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            check_expand(x, pos, pte, target, flavor, f"T={T} H={H} {dtype}")
        assert_bitwise_equal(x, data(T, H, dtype, seed), "x unchanged")


def test_wrapping_tiles_on_ascend_sim() -> None:
    """More work tiles than twice the simulated cores (every core reuses both buffer versions), under the
    schedules that expose a missing wait."""
    for seed, schedule in enumerate(("consumers_first", "producers_first")):
        T = 2 * SIM_CORES * BLOCK_M // K + 100
        pos, pte = mapping(T, 40 + seed, extra=2 * BLOCK_M + 3)
        assert pte.shape[0] > 2 * SIM_CORES * BLOCK_M
        x = data(T, 24, torch.bfloat16, seed)
        with sim_schedule(schedule):
            check_expand(x, pos, pte, SIM, "ascend", f"{schedule}")


@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
def test_edge_mappings(flavor: str, target: str) -> None:
    """No tokens but padding rows; tokens but no rows (every slot -1); every slot unused; H = 0; one
    token on the last row."""
    x = data(5, 40, torch.float32, 1)
    none = torch.full((5, K), -1, dtype=torch.int32)
    cases = {
        "T=0, N=7 padding": (x[:0], none[:0], torch.full((7,), -1, dtype=torch.int32)),
        "N=0": (x, none, torch.zeros(0, dtype=torch.int32)),
        "all unused": (x, none, torch.full((40,), -1, dtype=torch.int32)),
        "H=0": (x[:, :0], *mapping(5, 2)),
    }
    last = none.clone()
    last[3, 5] = 9
    cases["last row"] = (x, last, torch.tensor([-1] * 9 + [2], dtype=torch.int32))
    for what, (xs, pos, pte) in cases.items():
        check_expand(xs.contiguous(), pos, pte, target, flavor, what)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_odd_byte_rows_on_cpu(flavor: str) -> None:
    """An fp8 row of odd width goes in 1-byte words (its own kernel)."""
    for seed, T in enumerate((1, 45)):
        pos, pte = mapping(T, 60 + seed)
        check_expand(data(T, 37, torch.float8_e4m3fn, seed), pos, pte, "cpu", flavor, f"fp8 H=37 T={T}")


# (tokens, hidden, num_per_channels, SF dtype, column-major)
SF_CASES = [(37, 512, 128, torch.float32, False), (37, 512, 32, torch.int32, True), (5, 300, 64, torch.float32, True),
            (70, 1100, 16, torch.float32, False), (0, 256, 128, torch.float32, True),
            (3, 256, 128, torch.int32, False)]


def sf_words(hidden: int, npc: int, dtype: torch.dtype) -> int:
    """ceil(H / npc) values, four to an int32 word, two to an int16 word."""
    values = (hidden + npc - 1) // npc
    pack = {torch.float32: 1, torch.int32: 4, torch.int16: 2}[dtype]
    return (values + pack - 1) // pack


@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
def test_with_sf_matches_reference(flavor: str, target: str) -> None:
    for seed, (T, H, npc, dtype, col_major) in enumerate(SF_CASES):
        pos, pte = mapping(T, 100 + seed, extra=seed)
        x = data(T, H, torch.float8_e4m3fn, seed)
        for out_col_major in (False, True):
            sf = sf_grid(T, sf_words(H, npc, dtype), dtype, seed, col_major)
            with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):
                _, out_sf = check_with_sf(x, sf, npc, pos, pte, out_col_major, target, flavor,
                                          f"T={T} H={H} npc={npc} {dtype} in col={col_major} out col={out_col_major}")
            if out_col_major:
                # TileKernels' layout: the transposed view of [hidden_sf, align(N, 4)] (cuda flavor).
                align = 4 if flavor == "cuda" else 1
                assert out_sf.stride() == (1, -(-pte.shape[0] // align) * align) or out_sf.numel() == 0


def test_with_sf_column_major_padding_rows_are_zero() -> None:
    """cuda flavor, N = 4n + 1: three alignment rows of the buffer, zero although the buffer is new."""
    pos, pte = mapping(20, 7, extra=1)
    pte = torch.cat([pte, torch.full(((1 - pte.shape[0]) % 4,), -1, dtype=torch.int32)])
    assert pte.shape[0] % 4 == 1
    sf = sf_grid(20, 8, torch.float32, 7, False)
    for _ in range(2):  # the second call reuses the first one's freed memory
        _, out_sf = expand_to_fused_with_sf((data(20, 256, torch.float8_e4m3fn, 7), sf), 32, pos, pte, True,
                                            target="cpu", flavor="cuda")
        assert bool((sf_buffer(out_sf)[:, pte.shape[0]:].view(torch.int32) == 0).all())


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_split_over_threads(flavor: str, vmi_env) -> None:
    vmi_env.setenv(THREADS_ENV, "3")
    pos, pte = mapping(300, 8)
    assert len(row_ranges(pte.shape[0], 3, BLOCK_M, 32)) >= 2
    x = data(300, 48, torch.bfloat16, 8)
    out = check_expand(x, pos, pte, "cpu", flavor, "split")
    sf = sf_grid(300, 2, torch.float32, 8, True)
    split = check_with_sf(x, sf, 32, pos, pte, True, "cpu", flavor, "split sf")
    vmi_env.setenv(THREADS_ENV, "1")
    assert_bitwise_equal(expand_to_fused(x, pos, pte, target="cpu", flavor=flavor), out, "one thread")
    one = expand_to_fused_with_sf((x, sf), 32, pos, pte, True, target="cpu", flavor=flavor)
    assert_bitwise_equal(one[1], split[1], "one thread sf")


def test_entry_points_agree() -> None:
    pos, pte = mapping(50, 9)
    x = data(50, 64, torch.bfloat16, 9)
    out = expand_to_fused(x, pos, pte, target="cpu")
    for what, other in {"second run": expand_to_fused(x, pos, pte, target="cpu"),
                        "parallel": expand_to_fused_parallel(x, pos, pte, target="cpu"),
                        "torch": expand_to_fused(x, pos, pte, target="torch"),
                        "torch op": torch.ops.vmi.expand_to_fused(x, pos, pte, target="cpu")}.items():
        assert_bitwise_equal(other, out, what)
    sf = sf_grid(50, 1, torch.int32, 9, True)
    got = expand_to_fused_with_sf_parallel((x, sf), 128, pos, pte, True, target="cpu")
    for a, b in zip(got, expand_to_fused_with_sf((x, sf), 128, pos, pte, True, target="torch"), strict=True):
        assert_bitwise_equal(a, b, "with_sf parallel")


def test_fake_tensors_give_the_layout() -> None:
    pos, pte = mapping(10, 3)
    x = data(10, 256, torch.float8_e4m3fn, 3)
    sf = sf_grid(10, 2, torch.float32, 3, False)
    out, out_sf = expand_to_fused_with_sf((x.to(META), sf.to(META)), 128, pos.to(META), pte.to(META), True,
                                          flavor="cuda", target="cpu")
    ref, ref_sf = expand_to_fused_with_sf((x, sf), 128, pos, pte, True, target="torch", flavor="cuda")
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert out_sf.shape == ref_sf.shape and out_sf.stride() == ref_sf.stride()


# --- errors ----------------------------------------------------------------------------------------

no_kernel = no_kernel_fixture("vmi_moe.kernels.expand_to_fused", autouse=False)

XE = data(4, 64, torch.bfloat16, 0)
# K = 8, as the other tests (no kernel of its own): slots past the second unused.
POS = torch.nn.functional.pad(torch.tensor([[0, 1], [2, -1], [-1, -1], [3, 4]], dtype=torch.int32), (0, K - 2),
                              value=-1)
PTE = torch.tensor([0, 1, 1, 2, 3, -1], dtype=torch.int32)
X8 = data(4, 256, torch.float8_e4m3fn, 0)
SF = torch.ones(4, 2)


def with_sf(x=X8, sf=SF, npc=128, pos=POS, pte=PTE, col=False, **kwargs):
    return expand_to_fused_with_sf((x, sf), npc, pos, pte, col, **kwargs)


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: expand_to_fused(XE.tolist(), POS, PTE), TypeError, "x must be a torch.Tensor"),
    (lambda: expand_to_fused(XE.to(torch.int32), POS, PTE), TypeError, "x must be torch.float32 or"),
    (lambda: expand_to_fused(XE.double(), POS, PTE), TypeError, "x must be torch.float32 or"),
    (lambda: expand_to_fused(XE[0], POS, PTE), ValueError, "x must have shape"),
    (lambda: expand_to_fused(XE.t(), POS.t().contiguous()[:, :4], PTE), ValueError, "x must be contiguous"),
    (lambda: expand_to_fused(XE, POS.long(), PTE), TypeError, "token_topk_to_pos must be torch.int32"),
    (lambda: expand_to_fused(XE, POS[:, 0], PTE), ValueError, "token_topk_to_pos must have shape"),
    (lambda: expand_to_fused(XE, POS.t().contiguous().t(), PTE), ValueError, "token_topk_to_pos must be contiguous"),
    (lambda: expand_to_fused(XE, POS[:3], PTE), ValueError, "token_topk_to_pos must have one row per token"),
    (lambda: expand_to_fused(XE, POS[:, :0], PTE), ValueError, "token_topk_to_pos must have 1 to 32 columns"),
    (lambda: expand_to_fused(XE, torch.zeros(4, 33, dtype=torch.int32), PTE), ValueError, "1 to 32 columns"),
    (lambda: expand_to_fused(XE, POS.to(META), PTE), ValueError, "token_topk_to_pos must be on cpu"),
    (lambda: expand_to_fused(XE, POS, PTE.long()), TypeError, "pos_to_expert must be torch.int32"),
    (lambda: expand_to_fused(XE, POS, PTE.view(2, 3)), ValueError, "pos_to_expert must have shape"),
    (lambda: expand_to_fused(XE, POS, torch.zeros(12, dtype=torch.int32)[::2]), ValueError,
     "pos_to_expert must be contiguous"),
    (lambda: expand_to_fused(XE, POS, PTE.to(META)), ValueError, "pos_to_expert must be on cpu"),
    (lambda: expand_to_fused(XE, POS, "PTE"), TypeError, "pos_to_expert must be a torch.Tensor"),
    (lambda: expand_to_fused(XE, POS, PTE, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: expand_to_fused(XE, POS, PTE, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: expand_to_fused_parallel(XE, POS, PTE, target="torch"), ValueError, "always runs the kernel"),
    # with_sf
    (lambda: expand_to_fused_with_sf([X8, SF], 128, POS, PTE), TypeError, r"x must be a quantized \(data, sf\) tuple"),
    (lambda: expand_to_fused_with_sf((X8,), 128, POS, PTE), ValueError, "got a tuple of 1"),
    (lambda: with_sf(x=X8.view(torch.int8)), TypeError, "x data must be torch.float32 or"),
    (lambda: with_sf(sf=SF.double()), TypeError, "x sf must be float32, or packed UE8M0"),
    (lambda: with_sf(sf=SF.to(torch.float8_e4m3fn)), TypeError, "x sf must be float32, or packed UE8M0"),
    (lambda: with_sf(sf=SF.tolist()), TypeError, "x sf must be a torch.Tensor"),
    (lambda: with_sf(sf=SF[:, :1]), ValueError, r"x sf must have shape \(4, 2\)"),
    (lambda: with_sf(sf=SF[:3]), ValueError, r"x sf must have shape \(4, 2\)"),
    (lambda: with_sf(sf=torch.ones(4, 1, dtype=torch.int32), npc=32), ValueError, r"x sf must have shape \(4, 2\)"),
    (lambda: with_sf(sf=torch.ones(4, 4)[:, ::2]), ValueError, "x sf must be row-major or column-major"),
    (lambda: with_sf(sf=SF.to(META)), ValueError, "x sf must be on cpu"),
    (lambda: with_sf(npc=48), ValueError, "num_per_channels must be one of"),
    (lambda: with_sf(npc=128.0), TypeError, "num_per_channels must be an int"),
    (lambda: with_sf(col=1), TypeError, "use_tma_aligned_col_major_sf must be a bool"),
    (lambda: with_sf(pos=POS[:2]), ValueError, "token_topk_to_pos must have one row per token of x data"),
    (lambda: with_sf(target="torch", flavor="tpu"), ValueError, "flavor must be one of"),
    (lambda: expand_to_fused_with_sf_parallel((X8, SF), 128, POS, PTE, target="torch"), ValueError,
     "always runs the kernel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


BAD_MAPPINGS = {
    "position N": (lambda pos, pte: pos.__setitem__((3, 1), pte.shape[0]), "holds positions outside \\[-1, "),
    "position -2": (lambda pos, pte: pos.__setitem__((0, 0), -2), "holds positions outside \\[-1, "),
    "huge position": (lambda pos, pte: pos.__setitem__((1, 0), 2**31 - 1), "outside"),
    "padding target": (lambda pos, pte: pos.__setitem__((2, 0), 5), "places slots on padding rows"),
    "untargeted row": (lambda pos, pte: pos.__setitem__((3, 0), -1), "a different number of slots"),
    "two slots on one row": (lambda pos, pte: pos.__setitem__((2, 1), 0), "a different number of slots"),
}


@pytest.mark.parametrize("target", ["cpu", "torch", pytest.param(SIM, marks=pytest.mark.slow)])
@pytest.mark.parametrize("bad", list(BAD_MAPPINGS))
def test_bad_mappings_raise_after_the_kernel(bad: str, target: str) -> None:
    """What the kernel checks (ascend-sim's bounds-checked pointers also show that no bad position is
    written); the reference raises alike."""
    pos, pte = POS.clone(), PTE.clone()
    change, match = BAD_MAPPINGS[bad]
    change(pos, pte)
    with pytest.raises(ValueError, match=match):
        expand_to_fused(XE, pos, pte, target=target)
    with pytest.raises(ValueError, match=match):
        with_sf(pos=pos, pte=pte, col=True, target=target)
    # Checked again by a planned (repeated) call.
    if target == "cpu":
        with pytest.raises(ValueError, match=match):
            expand_to_fused(XE, pos, pte, target=target)


def test_bad_mapping_on_ascend_sim_writes_nothing_outside() -> None:
    pos = POS.clone()
    pos[3, 1] = 6
    pos[0, 0] = -5
    with pytest.raises(ValueError, match="outside"):
        expand_to_fused(XE, pos, PTE, target=SIM)


def test_a_hole_hidden_by_a_duplicate_is_not_seen() -> None:
    """The documented blind spot: two slots on row 1 and none on row 3 balance out."""
    pos = POS.clone()
    pos[3, 0] = 1
    out = expand_to_fused(XE, pos, PTE, target="cpu")
    assert out.shape == (6, 64)


# --- lowering --------------------------------------------------------------------------------------

def test_ascend_lowering() -> None:
    """No SIMD region; two SIMT regions (the zero tile's fill, the SF words); DMA in of positions,
    pos_to_expert and the data chunk, out of the status row, the slot rows and the zero rows."""
    src = build_expand_to_fused.source(ExpandSpec(K, 4), "ascend")
    assert "__global__ __vector__ void expand_to_fused_kernel" in src
    assert_vector_regions(src, simd=0, simt=2)
    assert barriers_in_thread_guards(src) == 0
    gm_to_ub, ub_to_gm = dma_counts(src)
    assert gm_to_ub >= 3 and ub_to_gm >= 3, (gm_to_ub, ub_to_gm)
    assert "block_idx" in src


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_lowering_compiles() -> None:
    src = build_expand_to_fused.source(ExpandSpec(K, 4), "cuda")
    assert "__global__ void" in src and "expand_to_fused_kernel" in src
    assert barriers_in_thread_guards(src) == 0
    check_cuda_source(src)


# --- sweeps ----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
@pytest.mark.parametrize("k", [1, 2, 6, 32])
def test_matches_reference_full(flavor: str, target: str, k: int) -> None:
    for seed, (T, H, dtype) in enumerate([(1, 37, torch.bfloat16), (77, 37, torch.float8_e4m3fn),
                                          (200, 7168, torch.bfloat16), (513, 130, torch.float32)]):
        pos, pte = mapping(T, 300 + seed, k=k, experts=max(k, 40), extra=seed * 17)
        check_expand(data(T, H, dtype, seed), pos, pte, target, flavor, f"K={k} T={T} H={H} {dtype}")


@pytest.mark.slow
@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
def test_with_sf_int16_words(flavor: str, target: str) -> None:
    """The ascend flavor's packed UE8M0 words (int16, two exponents each), both layouts, and 2-byte data words."""
    for seed, (T, H, npc) in enumerate([(40, 512, 32), (9, 384, 128), (60, 130, 16)]):
        pos, pte = mapping(T, 400 + seed)
        for col_major in (False, True):
            sf = sf_grid(T, sf_words(H, npc, torch.int16), torch.int16, seed, col_major)
            check_with_sf(data(T, H, torch.float8_e4m3fn, seed), sf, npc, pos, pte, col_major, target, flavor,
                          f"T={T} H={H} npc={npc} col={col_major}")
        check_expand(data(T, 37, torch.bfloat16, seed), pos, pte, target, flavor, "bf16 H=37")


@pytest.mark.slow
@pytest.mark.parametrize("spec", [ExpandSpec(1, 1), ExpandSpec(32, 2, 2), ExpandSpec(6, 4, 2)], ids=str)
def test_lowering_full(spec: ExpandSpec) -> None:
    src = build_expand_to_fused.source(spec, "ascend")
    assert_vector_regions(src, simd=0, simt=2)
    assert barriers_in_thread_guards(src) == 0
    check_cuda_source(build_expand_to_fused.source(spec, "cuda"))
