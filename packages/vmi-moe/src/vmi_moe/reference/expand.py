"""PyTorch reference of ``expand_to_fused`` and ``expand_to_fused_with_sf`` (``docs/moe/expand_to_fused.md``).

Written from the op's definition, not from the kernel: output row ``p`` is the row of ``x`` of
the token whose slot targets ``p``, a padding row (``pos_to_expert[p] < 0``) is all zero bits,
and so are its scaling factors and the alignment rows of a column-major SF. Values are copied,
never converted, so the bits are ``x``'s (NaN payloads, signed zeros and all).
"""

import torch


def _check_mapping(token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """The placed slots' ``(token, position)``; raise as the kernel's status words do."""
    num_expanded = pos_to_expert.shape[0]
    pos = token_topk_to_pos.to(torch.int64)
    if ((pos < -1) | (pos >= num_expanded)).any():
        raise ValueError(f"token_topk_to_pos holds positions outside [-1, {num_expanded})")
    tokens, slots = torch.nonzero(pos >= 0, as_tuple=True)
    positions = pos[tokens, slots]
    if (pos_to_expert.to(torch.int64)[positions] < 0).any():
        raise ValueError("token_topk_to_pos places slots on padding rows (pos_to_expert < 0)")
    if positions.numel() != int((pos_to_expert >= 0).sum()):
        raise ValueError("token_topk_to_pos places a different number of slots than pos_to_expert has "
                         "non-padding rows")
    return tokens, positions


def _expand_rows(rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, num_expanded: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[p] = rows[t]`` for each ``(t, p)``, every other row zero bits (copied as integers)."""
    if out is None:
        out = torch.zeros((num_expanded, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[rows.element_size()]
    out.view(bits)[positions] = rows.view(bits)[tokens]
    return out


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """``[N, H]``: row ``p`` is ``x[t]`` for the slot ``(t, k)`` with ``token_topk_to_pos[t, k] == p``;
    padding rows (``pos_to_expert[p] < 0``) are zero bits.

    Raises ``ValueError`` for a position outside ``[-1, N)``, a slot on a padding row, or a count of
    placed slots other than the count of non-padding rows."""
    tokens, positions = _check_mapping(token_topk_to_pos, pos_to_expert)
    return _expand_rows(x, tokens, positions, pos_to_expert.shape[0])


def expand_to_fused_with_sf(x: tuple[torch.Tensor, torch.Tensor], token_topk_to_pos: torch.Tensor,
                            pos_to_expert: torch.Tensor, col_major_rows: int | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, sf)`` expanded like ``expand_to_fused``: the SF rows follow their tokens, padding rows'
    SF words are zero bits. ``col_major_rows``: None for a row-major ``[N, hidden_sf]`` SF, else the
    column-major layout: the transposed view of a ``[hidden_sf, col_major_rows]`` buffer
    (``col_major_rows >= N``), whose rows past ``N`` are zero too."""
    data, sf = x
    tokens, positions = _check_mapping(token_topk_to_pos, pos_to_expert)
    num_expanded = pos_to_expert.shape[0]
    out = _expand_rows(data, tokens, positions, num_expanded)
    hidden_sf = sf.shape[1]
    if col_major_rows is None:
        out_sf = _expand_rows(sf, tokens, positions, num_expanded)
    else:
        storage = torch.zeros((hidden_sf, col_major_rows), dtype=sf.dtype, device=sf.device)
        out_sf = storage[:, :num_expanded].t()
        if num_expanded == 0 or hidden_sf == 0:
            out_sf = torch.as_strided(storage, (num_expanded, hidden_sf), (1, max(col_major_rows, 1)))
        _expand_rows(sf, tokens, positions, num_expanded, out_sf)
    return out, out_sf
