"""``get_fused_mapping`` as three parallel-style TileLang kernels for ascend, cuda and cpu.

The layout places expert ``e``'s slots in ascending flat slot index ``token * K + k`` from
``expert_start[e]`` on. A slot's row therefore depends on the slots of every token before it:

1. **count** — work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile: DMA
   the expert pairs on chip; one lane walks the tile's slots in order and counts them per expert
   (flagging ids outside ``[-1, E)``); DMA the tile's counts to its row of a ``[tiles, E]`` table.
2. **layout** — one lane, after every tile is counted: per expert the total, its range rounded up
   to ``alignment`` (``expert_start``, ``expert_end``, ``num_tokens_per_expert``), the padding rows
   of the range and every row past the last range set to -1 (a flag where the ranges need more rows
   than there are); each count in the table becomes its tile's first row of the expert (the
   expert's start plus the counts of the tiles before it).
3. **place** — per tile again: one lane walks the slots in order, takes each slot's row from its
   expert's running row (starting at the tile's entry of the table) and writes the four maps.

The lanes of steps 1 and 3 index counters and rows by expert id and write the maps at computed
rows, and step 2 walks the table by expert: on Ascend all three run in SIMT regions (computed
addresses), one lane per tile, the tiles spread over the cores. Every row written is inside the
maps: a slot whose row would fall past them is dropped (and the layout's flag raised). Tokens,
tiles, rows and the alignment are runtime values: one compiled kernel of each step per ``(E, K)``.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell

from .common import STATUS_BAD_INDEX, STATUS_OVERFLOW, STATUS_WORDS, padded, row_bytes, tile_rows


@dataclass(frozen=True)
class FusedMappingSpec:
    """Everything a fused-mapping kernel is specialised on."""

    num_experts: int
    num_topk: int

    @property
    def block_m(self) -> int:
        """Tokens per work tile (expert pairs and rows)."""
        return tile_rows(row_bytes(2 * self.num_topk, self.num_topk))


@dataclass(frozen=True)
class FusedLayoutSpec:
    """What the layout step is specialised on (its body does not depend on ``num_topk``)."""

    num_experts: int


def num_tiles(num_tokens: int, spec: FusedMappingSpec) -> int:
    """Rows of the count table: one per work tile, at least one (the layout step reads a row)."""
    return max(1, -(-num_tokens // spec.block_m))


def _slot_expert(ix, i, k, E: int):
    """Slot ``k`` of tile row ``i``: its expert id, or -1 for an unused slot or a bad id (both
    words of a valid id's int64: low word in ``[0, E)``, high word 0)."""
    valid = T.And(ix[i, 2 * k + 1] == 0, T.And(ix[i, 2 * k] >= 0, ix[i, 2 * k] < E))
    return T.Select(valid, ix[i, 2 * k], -1)


@kernel(simd_parallel=False)
def build_fused_mapping_count(spec: FusedMappingSpec, target: str):
    """Step 1: the per-tile slot counts of each expert."""
    sh = Shell(target)
    TK = sh.T
    E, K, BM = spec.num_experts, spec.num_topk, spec.block_m
    M = TK.dynamic("M")
    NT = TK.dynamic("NT")

    @TK.prim_func
    def fused_mapping_count_kernel(IDX: TK.Tensor((M, 2 * K), "int32"), COUNTS: TK.Tensor((NT, E), "int32"),
                                   STATUS: TK.Tensor((STATUS_WORDS,), "int32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                ix = sh.tile((BM, padded(2 * K)), "int32")
                sh.buffer_versions({ix: 2})
                sh.copy(IDX[row0, 0], ix)
                with sh.vector(SIMT):
                    for _ in T.Parallel(1):
                        expert = T.alloc_var("int32")
                        count = T.alloc_local((E,), "int32")
                        for e in T.serial(E):
                            count[e] = 0
                        for i in T.serial(T.min(BM, M - row0)):
                            for k in T.serial(K):
                                expert = _slot_expert(ix, i, k, E)
                                if expert >= 0:
                                    count[expert] = count[expert] + 1
                                # Only -1 (both words) marks an unused slot.
                                elif ix[i, 2 * k] != -1 or ix[i, 2 * k + 1] != -1:
                                    STATUS[STATUS_BAD_INDEX] = 1
                        for e in T.serial(E):
                            COUNTS[tm, e] = count[e]

    return fused_mapping_count_kernel


@kernel(simd_parallel=False)
def build_fused_mapping_layout(spec: FusedLayoutSpec, target: str):
    """Step 2: the experts' ranges, the padding rows, and each tile's first row per expert."""
    sh = Shell(target)
    TK = sh.T
    E = spec.num_experts
    N = TK.dynamic("N")
    NT = TK.dynamic("NT")

    @TK.prim_func
    def fused_mapping_layout_kernel(COUNTS: TK.Tensor((NT, E), "int32"), EXPERT_START: TK.Tensor((E,), "int32"),
                                    EXPERT_END: TK.Tensor((E,), "int32"), SIZES: TK.Tensor((E,), "int32"),
                                    POS_TO_EXPERT: TK.Tensor((N,), "int32"), POS_TO_TOKEN: TK.Tensor((N,), "int32"),
                                    POS_TO_TOKEN_TOPK: TK.Tensor((N,), "int32"),
                                    STATUS: TK.Tensor((STATUS_WORDS,), "int32"), alignment: TK.int32):
        with sh.persistent_kernel() as worker:
            for _ in sh.tiles([1], worker):
                with sh.vector(SIMT):
                    for _ in T.Parallel(1):
                        total = T.alloc_local((E,), "int32")
                        start = T.alloc_var("int32")
                        size = T.alloc_var("int32")
                        count = T.alloc_var("int32")
                        for e in T.serial(E):
                            total[e] = 0
                        # Row-major walks of the table: totals first, then running rows.
                        for t, e in T.grid(NT, E):
                            total[e] = total[e] + COUNTS[t, e]
                        start = 0
                        for e in T.serial(E):
                            # Loop bounds from a scalar: Ascend's barrier planner takes no UB load there.
                            count = total[e]
                            size = T.ceildiv(count, alignment) * alignment
                            EXPERT_START[e] = start
                            EXPERT_END[e] = start + size
                            SIZES[e] = size
                            for p in T.serial(T.min(start + count, N), T.min(start + size, N)):
                                POS_TO_EXPERT[p] = -1
                                POS_TO_TOKEN[p] = -1
                                POS_TO_TOKEN_TOPK[p] = -1
                            total[e] = start
                            start = start + size
                        if start > N:
                            STATUS[STATUS_OVERFLOW] = 1
                        for p in T.serial(T.min(start, N), N):
                            POS_TO_EXPERT[p] = -1
                            POS_TO_TOKEN[p] = -1
                            POS_TO_TOKEN_TOPK[p] = -1
                        for t, e in T.grid(NT, E):
                            count = COUNTS[t, e]
                            COUNTS[t, e] = total[e]
                            total[e] = total[e] + count

    return fused_mapping_layout_kernel


@kernel(simd_parallel=False)
def build_fused_mapping_place(spec: FusedMappingSpec, target: str):
    """Step 3: each slot's row, and the maps between slots and rows."""
    sh = Shell(target)
    TK = sh.T
    E, K, BM = spec.num_experts, spec.num_topk, spec.block_m
    M = TK.dynamic("M")
    N = TK.dynamic("N")
    NT = TK.dynamic("NT")

    @TK.prim_func
    def fused_mapping_place_kernel(IDX: TK.Tensor((M, 2 * K), "int32"), FIRST_ROWS: TK.Tensor((NT, E), "int32"),
                                   TOKEN_TOPK_TO_POS: TK.Tensor((M, K), "int32"),
                                   POS_TO_EXPERT: TK.Tensor((N,), "int32"), POS_TO_TOKEN: TK.Tensor((N,), "int32"),
                                   POS_TO_TOKEN_TOPK: TK.Tensor((N,), "int32"), token_base: TK.int32):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                ix = sh.tile((BM, padded(2 * K)), "int32")
                rows = sh.tile((BM, padded(K)), "int32")
                sh.buffer_versions({ix: 2, rows: 2})
                sh.copy(IDX[row0, 0], ix)
                with sh.vector(SIMT):
                    for _ in T.Parallel(1):
                        next_row = T.alloc_local((E,), "int32")
                        for e in T.serial(E):
                            next_row[e] = FIRST_ROWS[tm, e]
                        expert = T.alloc_var("int32")
                        row = T.alloc_var("int32")
                        token = T.alloc_var("int32")
                        for i in T.serial(T.min(BM, M - row0)):
                            token = token_base + row0 + i
                            for k in T.serial(K):
                                expert = _slot_expert(ix, i, k, E)
                                row = -1
                                if expert >= 0:
                                    row = next_row[expert]
                                    next_row[expert] = row + 1
                                    if row < N:
                                        POS_TO_EXPERT[row] = expert
                                        POS_TO_TOKEN[row] = token
                                        POS_TO_TOKEN_TOPK[row] = token * K + k
                                    else:
                                        row = -1
                                rows[i, k] = row
                sh.copy(rows, TOKEN_TOPK_TO_POS[row0, 0])

    return fused_mapping_place_kernel


def count_table(spec: FusedMappingSpec, topk_idx: torch.Tensor, status: torch.Tensor, target: str) -> torch.Tensor:
    """Step 1: the new int32 ``[num_tiles, E]`` table of per-tile counts of the ids in contiguous int64
    ``topk_idx [T, K]``, ids outside ``[-1, E)`` flagged in ``status``; the tiles split across threads
    on cpu. With no tokens, one row of zeros and nothing compiled or run. Also the first step of the
    ops that only reduce the table (``vmi_moe.kernels.group_count``)."""
    BM = spec.block_m
    idx = topk_idx.view(torch.int32)
    counts = torch.zeros((num_tiles(idx.shape[0], spec), spec.num_experts), dtype=torch.int32, device=idx.device)

    def run(count, start: int, stop: int) -> None:
        count(idx[start:stop], counts[_tiles_of(start, stop, BM)], status)

    build_fused_mapping_count.launch_rows(spec, target, idx.shape[0], run, align=BM)
    return counts


def _tiles_of(start: int, stop: int, block_m: int) -> slice:
    """The count table's rows of the work tiles of rows ``[start, stop)`` (``start`` a tile's first)."""
    return slice(start // block_m, -(-stop // block_m))


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.get_fused_mapping.FusedMappingCall``) on ``target``: count,
    lay out, place; the count table is scratch (the layout turns it into each tile's first rows)."""
    spec = call.spec
    BM = spec.block_m
    idx = call.topk_idx.view(torch.int32)
    first_rows = count_table(spec, call.topk_idx, call.status, target)
    build_fused_mapping_layout.compiled(FusedLayoutSpec(spec.num_experts), target)(
        first_rows, call.expert_start, call.expert_end, call.num_tokens_per_expert, call.pos_to_expert,
        call.pos_to_token, call.pos_to_token_topk, call.status, call.alignment)

    def run(place, start: int, stop: int) -> None:
        place(idx[start:stop], first_rows[_tiles_of(start, stop, BM)], call.token_topk_to_pos[start:stop],
              call.pos_to_expert, call.pos_to_token, call.pos_to_token_topk, start)

    build_fused_mapping_place.launch_rows(spec, target, idx.shape[0], run, align=BM)
