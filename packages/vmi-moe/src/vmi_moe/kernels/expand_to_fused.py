"""``expand_to_fused`` (and ``_with_sf``) as one parallel-style TileLang kernel for ascend, cuda and cpu.

The kernel copies bit patterns: a data row travels as ``word_bytes``-byte words (4, 2 or 1: the
largest that divides the row's byte length), the scaling factors as 4- or 2-byte words, so one
compiled kernel serves every dtype of a word size, and both ops (a call without SF passes an SF
row length of 0); no target does dtype arithmetic.

A launch covers a range of *rows* that are at once token rows (of ``x`` and
``token_topk_to_pos``) and output positions (of ``pos_to_expert`` and the output):
``max(T, sf_rows)`` rows in all (``sf_rows``: ``N``, or a column-major SF buffer's aligned row
count), as TileKernels' grid. Work tiles of ``BLOCK_M`` rows go round-robin to persistent workers.
Per tile:

1. DMA the tokens' slot positions and the positions' ``pos_to_expert`` on chip;
2. scalar code, per slot of the tile: a position outside ``[-1, N)`` raises the flag
   ``FLAG_BAD_POSITION``; a position in range whose ``pos_to_expert`` (one scalar read of global
   memory) is negative raises ``FLAG_PADDING_TARGET``; the slot tile keeps the positions of the
   placed slots and -1 for every other (so no write happens for a flagged slot: bad input never
   writes outside the output, nor onto a padding row). Per position: -1 marks a padding row
   (``pos_to_expert < 0``) of the output. The balance, placed slots less non-padding rows, and the
   flags go to the tile's own row of the status tensor by DMA; the dispatch raises on a flag or
   when the balances do not sum to zero (a non-padding row without a slot, or two slots on one);
3. with scaling factors, a SIMT region: one lane per (row, SF column) copies the token's SF words
   to its placed slots' rows and writes zero words into padding rows and into the column-major
   alignment rows ``[N, sf_rows)``; the SF tensors are flat word buffers with two runtime strides
   each, so row- and column-major layouts share the kernel;
4. the row in chunks of ``CHUNK_BYTES``: DMA the tile's chunk on chip (two buffer versions), then
   one DMA of each token's chunk to each placed slot's row and one of a zero chunk (a tile filled
   once per worker) to each padding row: DMA to computed rows, issued from scalar code.

Regions: the data never enters a vector region (whole chunks move by the MTE engines; the rows
are addressed by positions the scalar unit reads from UB). SIMT, twice: the zero tile's fill (a
hand-written ``T.Parallel`` loop, which belongs in SIMT: ``Shell.vector``) and step 3 (every SF
word has a computed address in both tensors: a gather and a scatter through strides). The slot
checks are selects, not branches: with branches there, the Ascend lowering's schedule and sync
passes took about twice as long (seconds per kernel build). Token count, position count, row
length, SF row length and all strides are runtime values: one compiled kernel per ``(K, word_bytes, sf_word_bytes)``.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell

from .common import padded

# Rows (tokens and positions) per work tile.
BLOCK_M = 32
# Bytes of a row chunk: a work tile's data is BLOCK_M x CHUNK_BYTES (64 KiB, two versions in UB).
CHUNK_BYTES = 2048
# SF columns per lane pass of the SIMT region (BLOCK_M x SF_LANES lanes).
SF_LANES = 16

# A work tile's status words (one row of the status tensor per tile): flags, and the balance of
# placed slots less non-padding rows. Flags: a slot position outside [-1, N); a slot whose position
# is a padding row.
TILE_STATUS_WORDS = 2
TILE_FLAGS = 0
TILE_BALANCE = 1
FLAG_BAD_POSITION = 1
FLAG_PADDING_TARGET = 2

WORD_DTYPES = {1: "uint8", 2: "uint16", 4: "int32"}
TORCH_WORDS = {1: torch.uint8, 2: torch.uint16, 4: torch.int32}


@dataclass(frozen=True)
class ExpandSpec:
    """Everything an expand_to_fused kernel is specialised on (sizes and strides are runtime values).

    ``word_bytes``: the unit a data row is copied in (1, 2 or 4); ``sf_word_bytes``: the SF word
    (4 or 2). A call without scaling factors runs the kernel of 4-byte SF words with none (the SF
    row length 0), so both ops share one kernel per ``(K, word_bytes)``."""

    num_topk: int
    word_bytes: int
    sf_word_bytes: int = 4

    def __post_init__(self) -> None:
        if self.word_bytes not in WORD_DTYPES or self.sf_word_bytes not in (2, 4):
            raise ValueError(f"word sizes must be 1, 2 or 4 (SF: 2 or 4), got {self.word_bytes}, "
                             f"{self.sf_word_bytes}")

    @property
    def block_words(self) -> int:
        """Words of a row chunk."""
        return CHUNK_BYTES // self.word_bytes


def word_bytes_of(row_bytes: int) -> int:
    """The largest word size (4, 2, 1) that divides a row of ``row_bytes`` bytes."""
    return 4 if row_bytes % 4 == 0 else 2 if row_bytes % 2 == 0 else 1


def _config(spec: ExpandSpec) -> dict:
    # The zero tile's fill and the SF copy are SIMT loops over words: TileLang's SIMT lowering has no
    # Ascend type for vectors of 8- or 16-bit words (``uint16x4``), so those take element accesses.
    narrow = spec.word_bytes < 4 or spec.sf_word_bytes < 4
    return {"simd_parallel": False, **({"simt_8bit": True} if narrow else {})}


@kernel(config=_config)
def build_expand_to_fused(spec: ExpandSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    K, BM, BH = spec.num_topk, BLOCK_M, spec.block_words
    wdt = WORD_DTYPES[spec.word_bytes]
    sdt = WORD_DTYPES[spec.sf_word_bytes]
    M = TK.dynamic("M")  # tokens of this launch
    N = TK.dynamic("N")  # positions (output rows)
    HW = TK.dynamic("HW")  # words per data row
    NT = TK.dynamic("NT")  # work tiles of this launch
    SF_LEN = TK.dynamic("SF_LEN")
    OSF_LEN = TK.dynamic("OSF_LEN")

    def row_copy(src, dst):
        # cuda: a row of a shared tile to a computed global row is no TMA bulk copy (TileLang's TMA
        # analysis rejects the one-row slice of the tile): plain loads and stores there.
        if sh.is_cuda:
            return T.copy(src, dst, disable_tma=True)
        return sh.copy(src, dst)

    @T.macro
    def copy_sf(SF, OSF, POS_T, E_T, row0, prow0, num_rows, hs, s0, s1, o0, o1, sf_rows):
        # One lane per (row, SF column): the token's SF words to its placed slots' rows, zero SF
        # words to padding rows and to the alignment rows past N.
        for i, j in T.Parallel(BM, SF_LANES):
            for c in T.serial(T.ceildiv(hs, SF_LANES)):
                col = c * SF_LANES + j
                if col < hs:
                    for k in T.serial(K):
                        pos = POS_T[i, k]
                        if pos >= 0:
                            OSF[pos * o0 + col * o1] = SF[(row0 + i) * s0 + col * s1]
                    p = prow0 + i
                    if row0 + i < num_rows and p < sf_rows and (p >= N or E_T[i] < 0):
                        OSF[p * o0 + col * o1] = T.cast(0, sdt)

    @TK.prim_func
    def expand_to_fused_kernel(
        X: TK.Tensor((M, HW), wdt),
        POS: TK.Tensor((M, K), "int32"),
        PTE: TK.Tensor((N,), "int32"),
        OUT: TK.Tensor((N, HW), wdt),
        SF: TK.Tensor((SF_LEN,), sdt),
        OSF: TK.Tensor((OSF_LEN,), sdt),
        STATUS: TK.Tensor((NT, TILE_STATUS_WORDS), "int32"),  # this launch's tiles' rows
        row_base: TK.int32, num_rows: TK.int32, hs: TK.int32, s0: TK.int32, s1: TK.int32,
        o0: TK.int32, o1: TK.int32, sf_rows: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            zero = sh.tile((BH,), wdt)
            with sh.vector(SIMT):
                for j in T.Parallel(BH):
                    zero[j] = T.cast(0, wdt)
            for tm in sh.tiles([T.ceildiv(num_rows, BM)], worker):
                row0 = T.alloc_var("int32")
                prow0 = T.alloc_var("int32")
                h0 = T.alloc_var("int32")
                pos = T.alloc_var("int32")
                balance = T.alloc_var("int32")
                flags = T.alloc_var("int32")
                row0 = tm * BM
                prow0 = row_base + row0
                balance = 0
                flags = 0
                pt = sh.tile((BM, padded(K)), "int32")
                et = sh.tile((BM,), "int32")
                status = sh.tile((8,), "int32")
                sh.buffer_versions({pt: 2, et: 2})
                sh.copy(POS[row0, 0], pt)
                sh.copy(PTE[prow0], et)
                # Slots: a placed slot keeps its position, any other gets -1; rows: a padding row of the
                # output gets -1, any other 0 (scalar code: the positions in UB, their pos_to_expert
                # read from global memory; selects, not branches, keep the pipe schedule small).
                for i in T.serial(BM):
                    for k in T.serial(K):
                        pos = pt[i, k]
                        live = row0 + i < M
                        inside = live and pos >= 0 and pos < N
                        target = T.if_then_else(inside, PTE[T.max(T.min(pos, N - 1), 0)], 0)
                        placed = inside and target >= 0
                        flags = flags | T.if_then_else(live and (pos < -1 or pos >= N), FLAG_BAD_POSITION, 0) \
                            | T.if_then_else(inside and target < 0, FLAG_PADDING_TARGET, 0)
                        balance = balance + T.if_then_else(placed, 1, 0)
                        pt[i, k] = T.if_then_else(placed, pos, -1)
                    position = row0 + i < num_rows and prow0 + i < N
                    balance = balance - T.if_then_else(position and et[i] >= 0, 1, 0)
                    et[i] = T.if_then_else(position and et[i] < 0, -1, 0)
                status[TILE_FLAGS] = flags
                status[TILE_BALANCE] = balance
                sh.copy(status, STATUS[tm, 0])
                if hs > 0:
                    with sh.vector(SIMT):
                        copy_sf(SF, OSF, pt, et, row0, prow0, num_rows, hs, s0, s1, o0, o1, sf_rows)
                # The rows in chunks: each token's chunk to its placed slots' rows, the zero chunk to the
                # padding rows (DMA to computed rows).
                for c in T.serial(T.ceildiv(HW, BH)):
                    h0 = c * BH
                    x = sh.tile((BM, BH), wdt)
                    sh.buffer_versions({x: 2})
                    sh.copy(X[row0, h0], x)
                    for q in T.serial(BM * K):
                        pos = pt[q // K, q % K]
                        if pos >= 0:
                            row_copy(x[q // K, :], OUT[pos, h0])
                    for i in T.serial(BM):
                        if et[i] < 0:
                            row_copy(zero, OUT[prow0 + i, h0])

    return expand_to_fused_kernel


def _words(t: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    """A contiguous ``[rows, cols]`` tensor as rows of ``word``s (a zero-width one as a new empty tensor:
    its strides need not divide)."""
    if t.shape[1] == 0:
        # Row stride 0: the kernel's row length (0) is also read from the stride.
        return torch.empty(0, dtype=word, device=t.device).as_strided((t.shape[0], 0), (0, 1))
    return t.view(torch.uint8).view(word)


def _flat(t: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    """The words ``t`` spans from its first element, as a flat buffer (the kernel adds its strides);
    one dummy word when it spans none."""
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    if not span:
        return torch.zeros(1, dtype=word, device=t.device)
    return torch.as_strided(t, (span,), (1,)).view(word)


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.expand_to_fused.ExpandCall``) on ``target``."""
    spec = call.spec
    word, sf_word = TORCH_WORDS[spec.word_bytes], TORCH_WORDS[spec.sf_word_bytes]
    x, out = (_words(t, word) for t in (call.x, call.out))
    num_tokens = x.shape[0]
    if call.sf is None:
        sf_grid = torch.zeros((num_tokens, 0), dtype=sf_word, device=x.device)
        osf, (o0, o1) = _flat(sf_grid, sf_word), (0, 0)
    else:
        sf_grid = call.sf
        osf, (o0, o1) = _flat(call.out_sf_storage, sf_word), call.out_sf_strides
    hs, (s0, s1) = sf_grid.shape[1], sf_grid.stride()

    def run(kernel, start: int, stop: int) -> None:
        # Rows [start, stop): tokens up to T, positions up to sf_rows; the tiles' status rows.
        lo, hi = min(start, num_tokens), min(stop, num_tokens)
        status = call.status[start // BLOCK_M:-(-stop // BLOCK_M)]
        kernel(x[lo:hi], call.token_topk_to_pos[lo:hi], call.pos_to_expert, out, _flat(sf_grid[lo:hi], sf_word),
               osf, status, start, stop - start, hs, s0, s1, o0, o1, call.sf_rows)

    build_expand_to_fused.launch_rows(spec, target, call.num_rows, run, align=BLOCK_M)
