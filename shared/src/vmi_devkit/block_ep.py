"""The block's forward with 2-rank expert parallelism (``torch.distributed``, gloo, one process per
rank on this machine), compared with the single-process block.

Rank ``r`` holds sequence ``r`` (half the tokens) and half the experts: the physical expert slots
``[r·E/2, (r+1)·E/2)``. Logical expert ``e`` sits in physical slot ``E - 1 - e`` (the replica map
``to_physical_map`` with one replica each), so rank 0 holds the logical experts ``E/2 .. E-1``. Per
rank: mHC pre, RMSNorm + E4M3 cast and the gate (``moe_topk_gate_forward`` with ``ep_rank`` and the
map) on its tokens; the E4M3 rows, their scales, physical experts and weights go to the rank of the
expert (``all_to_all_single``); each rank runs its experts (up GEMM stand-in, SwiGLU + E4M3 cast,
down GEMM stand-in) on what it received and sends the rows back; the home rank combines and runs mHC
post and head.

The result is the single-process block's bit for bit, because every operation sees the same
operands in the same order: the mHC, RMSNorm, cast, gate, SwiGLU and combine steps are per token or
per row; a rank receives an expert's rows from rank 0 then rank 1, i.e. in ascending global token
order, the order of the single-process layout, so each expert GEMM has the same rows, the same M
and the same weights. Both runs are forward-only (``torch.no_grad``: mhc_pre takes the same fused
inference path in both) with one torch thread.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vmi_moe

from .block import (
    BlockConfig,
    BlockParams,
    ExpertLayout,
    Kernels,
    dequantize,
    expert_gemm,
    make_params,
    run_block,
    token_alignment,
)

WORLD_SIZE = 2


def replica_map(num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(to_physical_map (E, 1), logical_count (E,))``: logical expert ``e`` in slot ``E - 1 - e``."""
    physical = torch.arange(num_experts - 1, -1, -1, dtype=torch.int32)
    return physical.view(-1, 1).contiguous(), torch.ones(num_experts, dtype=torch.int32)


def _exchange(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    """``all_to_all_single`` of whole rows, any dtype (gloo moves FP8 as bytes)."""
    out = rows.new_empty(sum(recv_counts), *rows.shape[1:])
    as_bytes = rows.dtype.is_floating_point and rows.dtype.itemsize == 1
    src, dst = (rows.view(torch.uint8), out.view(torch.uint8)) if as_bytes else (rows, out)
    dist.all_to_all_single(dst, src.contiguous(), recv_counts, send_counts)
    return out


def expert_parallel_forward(rank: int, p: BlockParams, c: BlockConfig, target: str, flavor: str | None
                            ) -> torch.Tensor:
    """This rank's ``(T / 2, H)`` head output of the expert-parallel forward."""
    ops = Kernels(target, flavor)
    experts_per_rank = c.num_experts // WORLD_SIZE
    tokens = slice(rank * c.num_tokens // WORLD_SIZE, (rank + 1) * c.num_tokens // WORLD_SIZE)
    residual = ops.expand(p.x[tokens], c)
    layer_input, (post_mix, comb_mix) = ops.pre(residual, p, c)
    normed, (data, sf) = ops.norm_cast(layer_input, p, c)
    logits = normed.float() @ p.gate_weight.t()
    to_physical, logical_count = replica_map(c.num_experts)
    physical, weights = vmi_moe.moe_topk_gate_forward(logits, c.num_topk, False, 0, c.routed_scaling_factor, rank,
                                                      bias=p.gate_bias, to_physical_map=to_physical,
                                                      logical_count=logical_count, target=target, flavor=flavor)

    # Dispatch: the (token, slot) pairs by destination rank, in (token, slot) order within each.
    destination = (physical // experts_per_rank).reshape(-1)
    send_order = torch.sort(destination, stable=True).indices
    send_counts = torch.bincount(destination, minlength=WORLD_SIZE)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    pair_token = send_order // c.num_topk
    got_data = _exchange(data[pair_token], send, recv)
    got_sf = _exchange(sf[pair_token], send, recv)
    got_expert = _exchange(physical.reshape(-1)[send_order], send, recv) - rank * experts_per_rank
    got_weight = _exchange(weights.reshape(-1)[send_order], send, recv)

    # Local experts: the received pairs (rank 0's, then rank 1's) in the fused layout, one pair per row.
    layout = ExpertLayout.build(got_expert.view(-1, 1), experts_per_rank, token_alignment(), target, flavor)
    local_logical = c.num_experts - 1 - (rank * experts_per_rank + torch.arange(experts_per_rank))
    h = expert_gemm(ops.dispatch(dequantize(got_data, got_sf), layout), p.w_up[local_logical], layout)
    act = ops.swiglu(h.to(torch.bfloat16), ops.dispatch(got_weight.view(-1, 1), layout).view(-1), layout)
    out_rows = expert_gemm(act, p.w_down[local_logical], layout)
    returned = _exchange(ops.combine(out_rows, layout), recv, send)

    # The home rank's combine: its pairs' rows in (token, slot) order, summed per token as in one process.
    by_slot = torch.empty_like(returned).index_copy(0, send_order, returned)
    slot_rows = torch.arange(by_slot.shape[0], dtype=torch.int32).view(-1, c.num_topk)
    layer_output = vmi_moe.reduce_fused(by_slot, None, slot_rows, target=target, flavor=flavor).to(torch.bfloat16)
    return ops.head(ops.post(layer_output, residual, post_mix, comb_mix), p, c)


def _worker(rank: int, port: int, c: BlockConfig, seed: int, target: str, flavor: str | None, result: str,
            timeout_s: float) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout_s))
    try:
        p = make_params(c, seed)
        with torch.no_grad():
            # The first forward loads this process's kernels; the second is timed.
            expert_parallel_forward(rank, p, c, target, flavor)
            start = time.perf_counter()
            head = expert_parallel_forward(rank, p, c, target, flavor)
            seconds = time.perf_counter() - start
            heads = [torch.empty_like(head) for _ in range(WORLD_SIZE)]
            dist.all_gather(heads, head)
            if rank == 0:
                single = run_block(Kernels(target, flavor), p, c).head
                torch.save({"expert_parallel": torch.cat(heads), "single": single, "seconds": seconds}, result)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_expert_parallel(c: BlockConfig | None = None, seed: int = 0, target: str = "cpu",
                        flavor: str | None = None, timeout_s: float = 300.0) -> dict[str, torch.Tensor | float]:
    """Run the 2-rank forward and, on rank 0, the single-process one: ``{"expert_parallel": head,
    "single": head, "seconds": rank 0's second forward}``. Raises ``TimeoutError`` after ``timeout_s``."""
    c = c or BlockConfig()
    if c.num_experts % WORLD_SIZE or c.num_sequences != WORLD_SIZE:
        raise ValueError(f"the expert-parallel block needs {WORLD_SIZE} sequences and an even number of experts")
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "result.pt")
        context = mp.start_processes(_worker, args=(_free_port(), c, seed, target, flavor, result, timeout_s),
                                     nprocs=WORLD_SIZE, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the expert-parallel block did not finish in {timeout_s:g} s")
        return torch.load(result)
