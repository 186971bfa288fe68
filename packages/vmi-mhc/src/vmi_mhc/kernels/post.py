"""``mhc_post_fwd`` and ``mhc_post_bwd`` as parallel-style TileLang kernels for ascend, cuda and cpu.

Per token ``t`` the ``n`` residual streams are rows ``t·n, ..., t·n + n - 1`` of a ``(T·n, H)``
view; ``post`` is a ``(T, n)`` and ``comb`` a ``(T, n·n)`` fp32 table (``comb[t, i·n + o]`` =
``comb[i, o]``, input stream ``i``, output stream ``o``). The hidden dimension is cut into
``block`` columns (whole 64-lane registers, the last tile clamped by the DMA), the same number of
equal tiles as the hidden size needs at the block cap (``hidden_block``).

**Forward.** Persistent workers take the work items ``(token, hidden tile)``. Per item: DMA the
token's ``post`` and ``comb`` rows, the ``x`` tile and the ``(n, block)`` residual tile in; per
column ``out[o] = bf16(post[o] · x + Σ_i comb[i, o] · res[i])`` in the fixed chain of
``vmi_mhc.tl.post.residual_update``; DMA the ``(n, block)`` output tile out.

**Backward.** Persistent workers take whole tokens, so that the token's reductions over ``H`` stay
in one worker (no inter-core reduction). Per token: DMA ``post`` and ``comb`` in and zero the 64
per-lane partial sums of each of the ``n`` ``d_post`` and ``n²`` ``d_comb`` entries; per hidden
tile, in order: DMA ``x``, the residual and ``d_o`` tiles in; per column ``d_x = Σ_o post[o] ·
d_o[o]`` and ``d_res[i] = Σ_o comb[i, o] · d_o[o]`` (``vmi_mhc.tl.post.weighted_sum``), rounded to
bf16 and DMA'd out; lane ``l`` of the partials adds ``d_o[o] · x`` and ``res[i] · d_o[o]`` of
columns ``l, l + 64, ...`` (fused, columns past ``H`` left out). After the last tile the partials
are folded (``Shell.row_sum``) and the ``n + n²`` sums DMA'd out: the lane order of
``vmi_core.sums.lane_sum_fused``, the same bits on every target and for any worker count.

On Ascend every phase is explicit SIMD vector code: the ``post`` and ``comb`` scalars are
broadcast into registers once per item (``BRC_B32`` loads), bf16 rows are unpacked into fp32 lanes
and packed back, and the backward makes ``d_x``, ``d_res`` and the partial-sum updates (in UB) in
one pass per 64 columns. On cpu and cuda the same arithmetic runs as ``T.Parallel`` loops (the
partial sums per lane, in scalars across a tile). On ``cpu`` a call's tokens are split across
threads (``vmi_core.cpu_parallel``).
"""

from dataclasses import dataclass

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, Vec, fma, keep, select, simd
from vmi_core.tl.vector import load, phase_barrier, store

from ..tl.lanes import zero
from ..tl.post import residual_update, weighted_sum

# Ascend unified-buffer budget of a kernel with SIMD regions only (spec mhc §2), and the bytes kept
# for the small per-token tables and partial sums next to the hidden tiles.
UB_BYTES = 248 * 1024
TABLE_BYTES = 8 * 1024
# Largest hidden tile (TileKernels: 4096 forward; 2560 backward, where a tile has 3n + 2 rows),
# and the versions of each hidden tile (DMA in of the next tile, compute, DMA out of the last).
FORWARD_MAX_BLOCK = 4096
BACKWARD_MAX_BLOCK = 2560
VERSIONS = 3
# Streams the forward kernel is built for; the backward keeps n + n² partial-sum registers and is
# built for n = 4 only (vmi_mhc.inputs.MHC_MULT).
MAX_FORWARD_MHC_MULT = 8


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _block_cap(max_block: int, rows: int) -> int:
    """The largest multiple of LANES, at most ``max_block``, whose ``rows`` bf16 rows fit the UB
    ``VERSIONS`` times next to the tables."""
    fit = (UB_BYTES - TABLE_BYTES) // (VERSIONS * rows * 2) // LANES * LANES
    return min(max_block, fit)


def hidden_block(hidden: int, cap: int) -> int:
    """Columns of a hidden tile: ``hidden`` in as few tiles of at most ``cap`` columns as possible,
    of equal size rounded up to whole registers."""
    tiles = -(-hidden // cap)
    return _align(-(-hidden // tiles), LANES)


@dataclass(frozen=True)
class PostForwardSpec:
    """Everything the forward kernel is specialised on (the token count is a runtime value)."""

    mhc_mult: int
    hidden: int

    @property
    def block(self) -> int:
        # Per column: n residual and n output rows and x.
        return hidden_block(self.hidden, _block_cap(FORWARD_MAX_BLOCK, 2 * self.mhc_mult + 1))


@dataclass(frozen=True)
class PostBackwardSpec:
    """Everything the backward kernel is specialised on (the token count is a runtime value)."""

    mhc_mult: int
    hidden: int

    @property
    def block(self) -> int:
        # Per column: n rows each of residual, d_o and d_residual, and x and d_x.
        return hidden_block(self.hidden, _block_cap(BACKWARD_MAX_BLOCK, 3 * self.mhc_mult + 2))


def _mixes(post, comb, n: int, vector: bool):
    """``(post[0..n), comb[0..n²))`` of a token's fp32 tables: in vector code broadcast into
    registers (``BRC_B32`` loads), once per item."""
    if vector:
        broadcast = [keep(Vec(simd().vld(table[k], dist="BRC_B32"))) for table, size in ((post, n), (comb, n * n))
                     for k in range(size)]
        return broadcast[:n], broadcast[n:]
    return [post[o] for o in range(n)], [comb[k] for k in range(n * n)]


def _bf16(tile, index: tuple, vector: bool):
    """The bf16 element(s) of ``tile`` at ``index`` (64 from there on in vector code) as fp32."""
    if vector:
        return keep(F.bf16_to_f32(load(tile[index])))
    return F.bf16_to_f32(tile[index])


def _store(tile, index: tuple, value, vector: bool):
    if vector:
        T.evaluate(store(tile[index], value))
    else:
        T.buffer_store(tile, value, list(index))


# --- forward -----------------------------------------------------------------------------------

def _update_columns(x, res, posts, combs, out, n: int, col, vector: bool):
    """The ``n`` output streams of the column(s) at ``col``."""
    xv = _bf16(x, (col,), vector)
    streams = [_bf16(res, (i, col), vector) for i in range(n)]
    for o in range(n):
        value = residual_update(posts[o], xv, [combs[i * n + o] for i in range(n)], streams)
        _store(out, (o, col), F.f32_to_bf16(value), vector)


def _update_registers(x, res, post, comb, out, n: int, block: int):
    posts, combs = _mixes(post, comb, n, True)
    with T.serial(block // LANES) as c:
        _update_columns(x, res, posts, combs, out, n, c * LANES, True)
    phase_barrier()


@kernel(simd_parallel=False)
def build_post_fwd(spec: PostForwardSpec, target: str):
    """The forward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    n, H, HB = spec.mhc_mult, spec.hidden, spec.block
    M = TK.dynamic("M")
    MR = TK.dynamic("MR")

    @T.macro
    def update_lanes(x, res, post, comb, out):
        for j in T.Parallel(HB):
            _update_columns(x, res, *_mixes(post, comb, n, False), out, n, j, False)

    @TK.prim_func
    def post_fwd_kernel(
        X: TK.Tensor((M, H), "uint16"),
        R: TK.Tensor((MR, H), "uint16"),
        POST: TK.Tensor((M, n), "float32"),
        COMB: TK.Tensor((M, n * n), "float32"),
        OUT: TK.Tensor((MR, H), "uint16"),
    ):
        with sh.persistent_kernel() as worker:
            for t, k in sh.tiles([M, T.ceildiv(H, HB)], worker):
                h0 = T.alloc_var("int32")
                h0 = k * HB
                post = sh.tile((n,), "float32")
                comb = sh.tile((n * n,), "float32")
                x = sh.tile((HB,), "uint16")
                res = sh.tile((n, HB), "uint16")
                out = sh.tile((n, HB), "uint16")
                sh.buffer_versions({post: VERSIONS, comb: VERSIONS, x: VERSIONS, res: VERSIONS, out: VERSIONS})
                sh.copy(POST[t, 0], post)
                sh.copy(COMB[t, 0], comb)
                sh.copy(X[t, h0], x)
                sh.copy(R[t * n, h0], res)
                with sh.vector(SIMD):
                    if sh.in_simd:
                        _update_registers(x, res, post, comb, out, n, HB)
                    else:
                        update_lanes(x, res, post, comb, out)
                sh.copy(out, OUT[t * n, h0])

    return post_fwd_kernel


# --- backward ----------------------------------------------------------------------------------

def _mix_columns(g, posts, combs, dx, dres, n: int, col, vector: bool):
    """``d_x`` and the ``n`` ``d_res`` streams of the column(s) at ``col``."""
    grads = [_bf16(g, (o, col), vector) for o in range(n)]
    _store(dx, (col,), F.f32_to_bf16(weighted_sum(posts, grads)), vector)
    for i in range(n):
        _store(dres, (i, col), F.f32_to_bf16(weighted_sum(combs[i * n:(i + 1) * n], grads)), vector)


def _partial_terms(x, res, g, n: int, col, vector: bool):
    """The fused products of the column(s) at ``col``: ``(d_o[o], x)`` per ``d_post`` entry ``o``,
    then ``(res[i], d_o[o])`` per ``d_comb`` entry ``i·n + o``."""
    xv = _bf16(x, (col,), vector)
    grads = [_bf16(g, (o, col), vector) for o in range(n)]
    streams = [_bf16(res, (i, col), vector) for i in range(n)]
    return [(grads[o], xv) for o in range(n)] + [(streams[i], grads[o]) for i in range(n) for o in range(n)]


def _partial_rows(post_parts, comb_parts, n: int):
    """The partial-sum rows in the order of ``_partial_terms``."""
    return [(post_parts, o) for o in range(n)] + [(comb_parts, k) for k in range(n * n)]


def _accumulate_lane(x, res, g, post_parts, comb_parts, n: int, hidden: int, h0, chunks, lane):
    # Lane ``lane``'s running sums in per-lane scalars, stored once (a read-modify-write of the tiles
    # in the loop would put a barrier inside it on cuda, in a branch only some threads take).
    rows = _partial_rows(post_parts, comb_parts, n)
    running = [LaneVar(False, "float32", tile[row, lane]) for tile, row in rows]
    with T.serial(chunks) as c:
        col = c * LANES + lane
        # Columns past H (a register tail) hold zeros (cpu) or stale data (cuda): their products stay out.
        inside = h0 + col < hidden
        for var, (a, b) in zip(running, _partial_terms(x, res, g, n, col, False), strict=True):
            value = fma(a, b, var.get())
            var.set(select(inside, value, var.get()) if hidden % LANES else value)
    for (tile, row), var in zip(rows, running, strict=True):
        T.buffer_store(tile, var.get(), [row, lane])


def _tile_registers(x, res, g, post, comb, dx, dres, post_parts, comb_parts, n: int, hidden: int, h0, chunks):
    # One pass per 64 columns: d_x and d_res, then the partial sums, updated in UB. Lanes past H
    # hold stale data: the masked fused multiply-add keeps their partials as they were.
    posts, combs = _mixes(post, comb, n, True)
    rows = _partial_rows(post_parts, comb_parts, n)
    with T.serial(chunks) as c:
        col = c * LANES
        _mix_columns(g, posts, combs, dx, dres, n, col, True)
        inside = keep(Vec.lane_index(h0 + col) < hidden) if hidden % LANES else None
        for (tile, row), (a, b) in zip(rows, _partial_terms(x, res, g, n, col, True), strict=True):
            partial = load(tile[row, 0])
            value = fma(a, b, partial)
            T.evaluate(store(tile[row, 0], value if inside is None else select(inside, value, partial)))
        # The next chunk loads the partials this one stored.
        T.evaluate(simd().mem_bar("VST_VLD"))
    phase_barrier()


@kernel(simd_parallel=False)
def build_post_bwd(spec: PostBackwardSpec, target: str):
    """The backward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    n, H, HB = spec.mhc_mult, spec.hidden, spec.block
    NT = -(-H // HB)
    M = TK.dynamic("M")
    MR = TK.dynamic("MR")

    @T.macro
    def mix_lanes(g, post, comb, dx, dres):
        for j in T.Parallel(HB):
            _mix_columns(g, *_mixes(post, comb, n, False), dx, dres, n, j, False)

    @T.macro
    def accumulate_lanes(x, res, g, post_parts, comb_parts, h0, chunks):
        for lane in T.Parallel(LANES):
            _accumulate_lane(x, res, g, post_parts, comb_parts, n, H, h0, chunks, lane)

    @T.macro
    def hidden_tile(x, res, g, post, comb, dx, dres, post_parts, comb_parts, h0, chunks):
        if sh.in_simd:
            _tile_registers(x, res, g, post, comb, dx, dres, post_parts, comb_parts, n, H, h0, chunks)
        else:
            mix_lanes(g, post, comb, dx, dres)
            accumulate_lanes(x, res, g, post_parts, comb_parts, h0, chunks)

    @TK.prim_func
    def post_bwd_kernel(
        X: TK.Tensor((M, H), "uint16"),
        R: TK.Tensor((MR, H), "uint16"),
        POST: TK.Tensor((M, n), "float32"),
        COMB: TK.Tensor((M, n * n), "float32"),
        DO: TK.Tensor((MR, H), "uint16"),
        DX: TK.Tensor((M, H), "uint16"),
        DR: TK.Tensor((MR, H), "uint16"),
        DPOST: TK.Tensor((M, n), "float32"),
        DCOMB: TK.Tensor((M, n * n), "float32"),
    ):
        with sh.persistent_kernel() as worker:
            post = sh.tile((n,), "float32")
            comb = sh.tile((n * n,), "float32")
            post_parts = sh.tile((n, LANES), "float32")
            comb_parts = sh.tile((n * n, LANES), "float32")
            d_post = sh.tile((n,), "float32")
            d_comb = sh.tile((n * n,), "float32")
            for t in sh.tiles([M], worker):
                sh.copy(POST[t, 0], post)
                sh.copy(COMB[t, 0], comb)
                with sh.vector(SIMD):
                    sh.elementwise((n, LANES), zero, post_parts)
                    sh.elementwise((n * n, LANES), zero, comb_parts)
                for k in T.serial(NT):
                    h0 = T.alloc_var("int32")
                    chunks = T.alloc_var("int32")
                    h0 = k * HB
                    chunks = T.min(HB // LANES, T.ceildiv(H - h0, LANES))
                    x = sh.tile((HB,), "uint16")
                    res = sh.tile((n, HB), "uint16")
                    g = sh.tile((n, HB), "uint16")
                    dx = sh.tile((HB,), "uint16")
                    dres = sh.tile((n, HB), "uint16")
                    sh.buffer_versions({x: VERSIONS, res: VERSIONS, g: VERSIONS, dx: VERSIONS, dres: VERSIONS})
                    sh.copy(X[t, h0], x)
                    sh.copy(R[t * n, h0], res)
                    sh.copy(DO[t * n, h0], g)
                    with sh.vector(SIMD):
                        hidden_tile(x, res, g, post, comb, dx, dres, post_parts, comb_parts, h0, chunks)
                    sh.copy(dx, DX[t, h0])
                    sh.copy(dres, DR[t * n, h0])
                with sh.vector(SIMD):
                    sh.row_sum(d_post, (n, LANES), lambda at: at.load(post_parts))
                    sh.row_sum(d_comb, (n * n, LANES), lambda at: at.load(comb_parts))
                sh.copy(d_post, DPOST[t, 0])
                sh.copy(d_comb, DCOMB[t, 0])

    return post_bwd_kernel


def _input_rows(call):
    """The inputs both kernels read, as token rows: x, the residual's stream rows, post, comb."""
    n, num_tokens, hidden = call.spec.mhc_mult, call.num_tokens, call.spec.hidden
    return (bit_view(call.x).reshape(num_tokens, hidden), bit_view(call.residual).reshape(num_tokens * n, hidden),
            call.post_layer_mix.reshape(num_tokens, n), call.comb_res_mix.reshape(num_tokens, n * n))


def launch_fwd(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.post.PostForwardCall``) on ``target``."""
    spec = call.spec
    n, num_tokens = spec.mhc_mult, call.num_tokens
    if num_tokens == 0:
        return
    x, res, post, comb = _input_rows(call)
    out = bit_view(call.out).view(num_tokens * n, spec.hidden)

    def run(kernel, start: int, stop: int) -> None:
        kernel(x[start:stop], res[start * n:stop * n], post[start:stop], comb[start:stop], out[start * n:stop * n])

    build_post_fwd.launch_rows(spec, target, num_tokens, run)


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.post.PostBackwardCall``) on ``target``."""
    spec = call.spec
    n, num_tokens = spec.mhc_mult, call.num_tokens
    if num_tokens == 0:
        return
    x, res, post, comb = _input_rows(call)
    d_o = bit_view(call.d_o).reshape(num_tokens * n, spec.hidden)
    d_x = bit_view(call.d_x).view(num_tokens, spec.hidden)
    d_res = bit_view(call.d_residual).view(num_tokens * n, spec.hidden)
    d_post = call.d_post_layer_mix.view(num_tokens, n)
    d_comb = call.d_comb_res_mix.view(num_tokens, n * n)

    def run(kernel, start: int, stop: int) -> None:
        rows = slice(start * n, stop * n)
        kernel(x[start:stop], res[rows], post[start:stop], comb[start:stop], d_o[rows], d_x[start:stop], d_res[rows],
               d_post[start:stop], d_comb[start:stop])

    build_post_bwd.launch_rows(spec, target, num_tokens, run)
