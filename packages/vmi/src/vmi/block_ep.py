"""The block with expert parallelism over ``torch.distributed``, forward and backward, on the ranks
that ``torchrun`` starts (any number ``W`` dividing the experts).

Rank ``r`` holds a contiguous range of the tokens (``token_range``: the ranges differ by at most one
token, so a sequence may be split anywhere) and the physical expert slots ``[r·E/W, (r+1)·E/W)``;
logical expert ``e`` sits in slot ``E - 1 - e`` (``replica_map``: the gate's ``to_physical_map`` with
one replica each). Every rank holds the other parameters whole (replicated, as data parallelism
holds them). A rank runs ``block.run_block`` on its tokens with the placement ``ExpertParallel``:

* the gate (``moe_topk_gate_autograd`` with its ``ep_rank`` and the map) returns physical experts;
* the expert section sends each (token, slot) pair's E4M3 row (data and scales), weight and expert
  to the expert's rank (``all_to_all_single``), runs the rank's experts on what arrived and sends
  each pair's output row back, where the pairs are combined per token in slot order;
* the sums over every token (the balance statistics per sequence, the loss) are sums over ranks.

Backward, every exchange sends its rows' gradients the other way (``Exchange.move`` with the other
direction: the reverse ``all_to_all_single``); the sums over ranks pass their gradient through
unchanged, since every rank computes the same function of the total. After the backward,
``ExpertParallel.reduce_gradients`` sums the replicated parameters' gradients over the ranks.

Why the results are the single-process block's bits (docs/block.md has the measurements): every
per-token and per-row operation sees the same operands; an expert's rows arrive from rank 0, 1, ...,
i.e. in ascending (token, slot) order, the order of the single-process layout, so each expert GEMM
(forward and backward) has the same rows in the same order; the home rank combines a token's rows
in slot order as one process does, and the dispatch's backward sums a token's row gradients in slot
order the same way. The gradients that are sums over tokens of replicated parameters are not: each
rank's kernels sum over its own tokens, and the ranks' partial sums are then added in rank order.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

import vmi_moe
from vmi_core.targets import device_of

from .block import (
    CAST,
    BlockConfig,
    BlockParams,
    BlockRun,
    ExpertLayout,
    dequantize,
    expert_rows,
    gc_paused,
    run_block,
)

# The collective backend of each device type: the one place it is chosen.
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
# Parameters every rank holds whole; x and the experts' weights are sharded.
REPLICATED = tuple(name for name in BlockParams.GRADIENTS if name not in ("x", "w_up", "w_down"))

Result = TypeVar("Result")


class RankError(RuntimeError):
    """An error on one rank, its message naming the rank (torchrun reports the failing rank's
    process; this names it in the exception too)."""


def on_each_rank(work: Callable[[int, int], Result], target: str, timeout_s: float) -> Result:
    """Join the process group that torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``) describes, on the backend of ``target``'s device, and run
    ``work(rank, world_size)``. A collective that waits longer than ``timeout_s`` (a rank hung or
    gone) raises; any error is re-raised as ``RankError`` naming this rank."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("no torch.distributed environment (RANK, WORLD_SIZE): start the ranks with "
                           "torchrun --nproc-per-node N --standalone ...")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        device = "cpu" if target == "torch" else device_of(target)
        if device != "cpu":
            getattr(torch, device).set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(BACKENDS[device], timeout=timedelta(seconds=timeout_s))
        return work(rank, world)
    except Exception as error:
        raise RankError(f"rank {rank} of {world}: {type(error).__name__}: {error}") from error
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def token_range(rank: int, world_size: int, num_tokens: int) -> range:
    """Rank ``rank``'s tokens: ``[⌊r·T/W⌋, ⌊(r+1)·T/W⌋)``."""
    return range(rank * num_tokens // world_size, (rank + 1) * num_tokens // world_size)


def replica_map(num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(to_physical_map (E, 1), logical_count (E,))``: logical expert ``e`` in slot ``E - 1 - e``."""
    physical = torch.arange(num_experts - 1, -1, -1, dtype=torch.int32)
    return physical.view(-1, 1).contiguous(), torch.ones(num_experts, dtype=torch.int32)


# --- the exchange and its backward ---

class Exchange:
    """Where this rank's (token, slot) pairs go, given each pair's destination rank; built on every
    rank at once (the row counts are exchanged). ``layout`` is the fused layout of the pairs by
    destination (``get_fused_mapping`` with alignment 1): the send buffer, each rank's pairs in
    (token, slot) order; ``order``: the buffer's pairs as flat (token, slot) indices."""

    def __init__(self, destination: torch.Tensor, world_size: int, target: str, flavor: str | None):
        self.target, self.flavor = target, flavor
        self.layout = ExpertLayout.build(destination, world_size, 1, target, flavor)
        rows = self.layout.token_topk_to_pos.reshape(-1).long()
        self.order = torch.empty_like(rows).index_copy_(0, rows, torch.arange(rows.numel(), device=rows.device))
        send = torch.tensor([end - start for start, end in self.layout.pair_rows], device=rows.device)
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)
        self.send_counts, self.received_counts = send.tolist(), received.tolist()

    def move(self, rows: torch.Tensor, back: bool = False) -> torch.Tensor:
        """``all_to_all_single`` of whole rows to the experts' ranks, or with ``back`` (the reverse
        exchange) from them; any dtype (FP8 moves as bytes, which gloo needs)."""
        in_counts, out_counts = ((self.received_counts, self.send_counts) if back
                                 else (self.send_counts, self.received_counts))
        out = rows.new_empty(sum(out_counts), *rows.shape[1:])
        as_bytes = rows.dtype.is_floating_point and rows.dtype.itemsize == 1
        src, dst = (rows.view(torch.uint8), out.view(torch.uint8)) if as_bytes else (rows, out)
        dist.all_to_all_single(dst, src.contiguous(), out_counts, in_counts)
        return out


class ExchangeRows(torch.autograd.Function):
    """``exchange.move(rows, back)``; backward: the gradients the other way. (Every rank builds the
    same graph, so autograd reaches the exchanges' backward nodes in the same order on each.)"""

    @staticmethod
    def forward(ctx, rows, exchange: Exchange, back: bool):
        ctx.exchange, ctx.back = exchange, back
        return exchange.move(rows, back)

    @staticmethod
    def backward(ctx, grad):
        return ctx.exchange.move(grad.contiguous(), not ctx.back), None, None


class SendCastRows(torch.autograd.Function):
    """Each pair's E4M3 row to its expert's rank as data and scales (``expand_to_fused_with_sf`` into
    the send buffer, then the exchange), arriving dequantized (fp32). Backward, straight through to
    the tensor that was cast: the rows' gradients come back (the reverse exchange) and each token's
    are summed in slot order (``reduce_fused``), as the single-process dispatch's backward sums them."""

    @staticmethod
    def forward(ctx, source, data, sf, exchange: Exchange):
        ctx.exchange, ctx.dtype = exchange, source.dtype
        layout = exchange.layout
        rows, row_sf = vmi_moe.expand_to_fused_with_sf((data, sf), CAST.num_per_channels, layout.token_topk_to_pos,
                                                       layout.pos_to_expert, target=exchange.target,
                                                       flavor=exchange.flavor)
        return dequantize(exchange.move(rows), exchange.move(row_sf))

    @staticmethod
    def backward(ctx, grad_rows):
        exchange = ctx.exchange
        grad = vmi_moe.reduce_fused(exchange.move(grad_rows.contiguous(), back=True), None,
                                    exchange.layout.token_topk_to_pos, target=exchange.target, flavor=exchange.flavor)
        return grad.to(ctx.dtype), None, None, None


def sum_in_rank_order(value: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of ``value`` (same shape on each), added in fp32 (int64 for integers) in
    rank order and rounded once to ``value``'s dtype: the same bits on every rank and every run."""
    parts = [torch.empty_like(value) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, value.contiguous())
    accumulate = torch.float32 if value.is_floating_point() else torch.int64
    total = parts[0].to(accumulate)
    for part in parts[1:]:
        total = total + part.to(accumulate)
    return total.to(value.dtype)


class SumOverRanks(torch.autograd.Function):
    """``sum_in_rank_order``, whose backward passes the total's gradient to each rank's share as it
    is: every rank computes the same function of the total (the balance loss, the loss), so the
    total's gradient is the same on every rank and is each share's."""

    @staticmethod
    def forward(ctx, value):
        return sum_in_rank_order(value)

    @staticmethod
    def backward(ctx, grad):
        return grad


# --- the placement ---

class ExpertParallel:
    """Rank ``rank``'s placement of the block (``block.run_block``): its tokens, its experts, the
    exchanges and the sums over ranks."""

    def __init__(self, rank: int, world_size: int, c: BlockConfig):
        if c.num_experts % world_size or c.num_tokens < world_size:
            raise ValueError(f"{world_size} ranks need a number of experts divisible by them and at least one token "
                             f"each; got {c.num_experts} experts and {c.num_tokens} tokens")
        self.rank, self.world_size = rank, world_size
        self.experts_per_rank = c.num_experts // world_size
        self.first_slot = rank * self.experts_per_rank
        # The logical experts of this rank's slots, in slot order.
        self.local_experts = c.num_experts - 1 - torch.arange(self.first_slot, self.first_slot + self.experts_per_rank)
        self.gate_options = {"ep_rank": rank, "replicas": replica_map(c.num_experts)}
        self.received_rows: list[int] = []  # the last forward's rows of each local expert

    def tokens(self, c: BlockConfig) -> range:
        return token_range(self.rank, self.world_size, c.num_tokens)

    @staticmethod
    def sum_over_ranks(value: torch.Tensor) -> torch.Tensor:
        return SumOverRanks.apply(value)

    def experts(self, ops, p: BlockParams, c: BlockConfig, t, normed, quantized, topk_idx, topk_weights):
        """The expert section across ranks: the layer output of this rank's tokens."""
        exchange = t.run("exchange counts", Exchange, topk_idx.detach() // self.experts_per_rank, self.world_size,
                         ops.target, ops.flavor)
        rows = t.run("exchange", SendCastRows.apply, normed, *quantized, exchange)
        weights = t.run("exchange", lambda w: ExchangeRows.apply(
            ops.dispatch(w.reshape(-1, 1), exchange.layout.slots()), exchange, False), topk_weights)
        expert = exchange.move(topk_idx.reshape(-1)[exchange.order]) - self.first_slot
        # The received pairs (from rank 0, 1, ...: ascending token order) in the fused layout, one per row.
        layout = t.run("routing layout", ops.layout, expert.view(-1, 1), self.experts_per_rank)
        self.received_rows = [end - start for start, end in layout.pair_rows]
        rows = t.run("dispatch", ops.dispatch, rows, layout)
        row_weights = t.run("dispatch", lambda w: ops.dispatch(w, layout).view(-1), weights)
        out_rows = expert_rows(ops, p, t, rows, row_weights, layout)
        pair_rows = t.run("combine", ops.combine, out_rows, layout)
        returned = t.run("exchange", ExchangeRows.apply, pair_rows, exchange, True)
        return t.run("combine", lambda y: ops.combine(y, exchange.layout).to(ops.activation_dtype), returned)

    def shard(self, p: BlockParams) -> BlockParams:
        """This rank's tensors of ``p`` (its tokens, its experts in slot order, the rest whole) as
        new leaves (``BlockParams.fresh``)."""
        tokens = token_range(self.rank, self.world_size, p.x.shape[0])
        tokens = slice(tokens.start, tokens.stop)
        return dataclasses.replace(p, x=p.x[tokens], probe=p.probe[tokens], w_up=p.w_up[self.local_experts],
                                   w_down=p.w_down[self.local_experts]).fresh()

    @staticmethod
    def reduce_gradients(shard: BlockParams) -> None:
        """Sum the replicated parameters' gradients over the ranks (``sum_in_rank_order``, one
        collective for all of them), in place."""
        grads = [getattr(shard, name).grad for name in REPLICATED]
        total = sum_in_rank_order(torch.cat([g.float().reshape(-1) for g in grads]))
        for grad, part in zip(grads, total.split([g.numel() for g in grads]), strict=True):
            grad.copy_(part.view_as(grad))

    def gather(self, shard: BlockParams, run: BlockRun) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """On rank 0, ``(head, gradients)`` of the whole block from every rank's shard after
        ``reduce_gradients``: x's and the head's rows in rank order, each expert's from its rank;
        None on the other ranks."""
        mine = {"head": run.head.detach(), "x": shard.x.grad, "w_up": shard.w_up.grad, "w_down": shard.w_down.grad,
                "experts": self.local_experts}
        parts = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if self.rank:
            return None
        grads = {name: getattr(shard, name).grad for name in REPLICATED}
        grads["x"] = torch.cat([part["x"] for part in parts])
        for name in ("w_up", "w_down"):
            grads[name] = full = mine[name].new_empty(self.world_size * self.experts_per_rank,
                                                      *mine[name].shape[1:])
            for part in parts:
                full[part["experts"]] = part[name]
        return torch.cat([part["head"] for part in parts]), grads


def train_step(ops, shard: BlockParams, c: BlockConfig, placement: ExpertParallel) -> BlockRun:
    """One forward and backward of this rank's shard (``ExpertParallel.shard``), then the sum of
    the replicated parameters' gradients over the ranks."""
    run = run_block(ops, shard, c, placement=placement)
    run.loss.backward()
    placement.reduce_gradients(shard)
    return run


@dataclasses.dataclass
class Comparison:
    """The expert-parallel training step against the single-process block, as rank 0 sees them;
    pairs are ``(expert parallel, single process)``."""

    world_size: int
    rank_tokens: list[int]
    received_rows: list[list[int]]   # per rank, the rows each of its experts received (slot order)
    head: tuple[torch.Tensor, torch.Tensor]
    loss: tuple[float, float]
    balance_loss: tuple[float, float]
    gradients: dict[str, tuple[torch.Tensor, torch.Tensor]]
    partial_sums: dict[str, torch.Tensor]  # per replicated parameter, Σ over ranks of |its gradient there|
    step_seconds: float                    # median training step, barrier to barrier
    single_seconds: float                  # median single-process forward and backward on rank 0


def compare_with_single_process(ops, p: BlockParams, c: BlockConfig, rank: int, world_size: int,
                                repeat: int = 5) -> Comparison | None:
    """On every rank: ``repeat`` timed training steps (after one that loads the kernels), then one
    whose results rank 0 gathers and compares with the single-process block, which it runs too.
    Rank 0 returns the comparison, the others None."""
    placement = ExpertParallel(rank, world_size, c)
    seconds = []
    for _ in range(repeat + 1):
        shard = placement.shard(p)
        with gc_paused():
            dist.barrier()
            start = time.perf_counter()
            train_step(ops, shard, c, placement)
            dist.barrier()
            seconds.append(time.perf_counter() - start)

    # train_step's steps, with each replicated gradient's Σ_r |partial| taken before the sum.
    shard = placement.shard(p)
    run = run_block(ops, shard, c, placement=placement)
    run.loss.backward()
    partial_sums = {name: sum_in_rank_order(getattr(shard, name).grad.abs().float()) for name in REPLICATED}
    placement.reduce_gradients(shard)
    received = [None] * world_size if rank == 0 else None
    dist.gather_object(placement.received_rows, received, dst=0)
    gathered = placement.gather(shard, run)
    if rank:
        return None

    single_seconds = []
    for _ in range(repeat + 1):
        single = p.fresh()
        with gc_paused():
            start = time.perf_counter()
            single_run = run_block(ops, single, c)
            single_run.loss.backward()
            single_seconds.append(time.perf_counter() - start)
    head, grads = gathered
    return Comparison(
        world_size, [len(token_range(r, world_size, c.num_tokens)) for r in range(world_size)], received,
        (head, single_run.head.detach()), (run.loss.item(), single_run.loss.item()),
        (run.balance_loss.item(), single_run.balance_loss.item()),
        {name: (grads[name], single.grads()[name]) for name in BlockParams.GRADIENTS}, partial_sums,
        statistics.median(seconds[1:]), statistics.median(single_seconds[1:]))
