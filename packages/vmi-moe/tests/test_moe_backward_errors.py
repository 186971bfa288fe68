"""Bad input of moe_topk_gate_backward raises a clear TypeError/ValueError naming the argument.

Argument errors are raised before any kernel runs (the kernel module's ``launch`` is
replaced by one that fails) and leave ``out`` untouched. Expert ids that only the kernel
sees (>= E, < -1, or int64 values whose low word alone would look valid) raise
``ValueError`` after the run. ``meta`` tensors stand in for a second device.
"""


import pytest
import torch

from vmi_core.tools.testing import generator
from vmi_devkit.errors import no_kernel_fixture
from vmi_moe import moe_topk_gate_backward, moe_topk_gate_backward_parallel

_G = generator(0)
T, E, K, NSEQ = 6, 8, 2, 2
S = torch.rand(T, E, generator=_G) + 0.1
IDX = torch.tensor([[0, 1], [2, 2], [3, -1], [-1, -1], [7, 4], [5, 6]])
W = torch.rand(T, K, generator=_G)
G = torch.randn(T, K, generator=_G)
MASK = torch.ones(T, dtype=torch.bool)
H = torch.randn(NSEQ, E, generator=_G)
AUX = {"mask": MASK, "grad_scores_sum": H}


no_kernel = no_kernel_fixture("vmi_moe.kernels.moe_topk_gate_backward", autouse=False)


def call(scores=S, topk_idx=IDX, topk_weights=W, grad_topk_weights=G, scale=1.5, **kwargs):
    return moe_topk_gate_backward(scores, topk_idx, topk_weights, grad_topk_weights, scale, **kwargs)


def strided(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous tensor of ``t``'s shape and values."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    view = wide[..., ::2]
    assert not view.is_contiguous()
    return view


META = torch.device("meta")


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("kwargs", "error", "match"), [
    # scores
    ({"scores": S.tolist()}, TypeError, "scores must be a torch.Tensor"),
    ({"scores": S.double()}, TypeError, "scores must be torch.float32"),
    ({"scores": S[0]}, ValueError, "scores must have shape"),
    ({"scores": S.view(2, 3, E)}, ValueError, "scores must have shape"),
    ({"scores": strided(S)}, ValueError, "scores must be contiguous"),
    ({"scores": torch.zeros(T, 0)}, ValueError, "at least one expert"),
    ({"scores": S.to(META)}, ValueError, "topk_idx must be on meta"),
    # topk_idx
    ({"topk_idx": IDX.int()}, TypeError, "topk_idx must be torch.int64"),
    ({"topk_idx": IDX.tolist()}, TypeError, "topk_idx must be a torch.Tensor"),
    ({"topk_idx": IDX[:5]}, ValueError, "topk_idx must have shape"),
    ({"topk_idx": IDX[:, 0]}, ValueError, "topk_idx must have shape"),
    ({"topk_idx": strided(IDX)}, ValueError, "topk_idx must have unit column stride"),
    ({"topk_idx": IDX.to(META)}, ValueError, "topk_idx must be on cpu"),
    ({"topk_idx": torch.zeros(T, 0, dtype=torch.int64)}, ValueError, r"num_topk\) must be in \[1, 32\]"),
    # K > E and K > 32
    ({"scores": S[:, :1].contiguous()}, ValueError, r"\(2\) must not exceed the number of experts \(1\)"),
    ({"scores": torch.rand(T, 40), "topk_idx": torch.zeros(T, 33, dtype=torch.int64),
      "topk_weights": torch.zeros(T, 33), "grad_topk_weights": torch.zeros(T, 33)},
     ValueError, r"num_topk\) must be in \[1, 32\], got 33"),
    # topk_weights and grad_topk_weights
    ({"topk_weights": W.double()}, TypeError, "topk_weights must be torch.float32"),
    ({"topk_weights": W[:, :1]}, ValueError, "topk_weights must have shape"),
    ({"topk_weights": W[:5]}, ValueError, "topk_weights must have shape"),
    ({"topk_weights": strided(W)}, ValueError, "topk_weights must be contiguous"),
    ({"topk_weights": W.to(META)}, ValueError, "topk_weights must be on cpu"),
    ({"topk_weights": None}, TypeError, "topk_weights must be a torch.Tensor"),
    ({"grad_topk_weights": G.half()}, TypeError, "grad_topk_weights must be torch.float32"),
    ({"grad_topk_weights": G.reshape(K, T)}, ValueError, "grad_topk_weights must have shape"),
    ({"grad_topk_weights": strided(G)}, ValueError, "grad_topk_weights must be contiguous"),
    ({"grad_topk_weights": G.to(META)}, ValueError, "grad_topk_weights must be on cpu"),
    # routed_scaling_factor and scoring_func
    ({"scale": "1.5"}, TypeError, "routed_scaling_factor must be a float"),
    ({"scale": True}, TypeError, "routed_scaling_factor must be a float"),
    ({"scale": None}, TypeError, "routed_scaling_factor must be a float"),
    ({"scoring_func": "softmax"}, ValueError, "scoring_func must be one of"),
    ({"scoring_func": "sigmoid", **AUX}, ValueError, "scoring_func"),
    # mask and grad_scores_sum
    ({"mask": MASK}, ValueError, "mask and grad_scores_sum must be given together"),
    ({"grad_scores_sum": H}, ValueError, "mask and grad_scores_sum must be given together"),
    ({"mask": MASK.to(torch.uint8), "grad_scores_sum": H}, TypeError, "mask must be torch.bool"),
    ({"mask": MASK.reshape(T, 1), "grad_scores_sum": H}, ValueError, "mask must have shape"),
    ({"mask": MASK[:5], "grad_scores_sum": H}, ValueError, "mask must have shape"),
    ({"mask": strided(MASK), "grad_scores_sum": H}, ValueError, "mask must be contiguous"),
    ({"mask": MASK.to(META), "grad_scores_sum": H}, ValueError, "mask must be on cpu"),
    ({"mask": MASK, "grad_scores_sum": H.double()}, TypeError, "grad_scores_sum must be torch.float32"),
    ({"mask": MASK, "grad_scores_sum": H[:, :5]}, ValueError, "grad_scores_sum must have shape"),
    ({"mask": MASK, "grad_scores_sum": H[0]}, ValueError, "grad_scores_sum must have shape"),
    ({"mask": MASK, "grad_scores_sum": strided(H)}, ValueError, "grad_scores_sum must be contiguous"),
    ({"mask": MASK, "grad_scores_sum": H.to(META)}, ValueError, "grad_scores_sum must be on cpu"),
    ({"mask": MASK, "grad_scores_sum": torch.zeros(4, E)}, ValueError, r"multiple of the number of sequences"),
    ({"mask": MASK, "grad_scores_sum": torch.zeros(0, E)}, ValueError, r"grad_scores_sum.size\(0\) = 0"),
    # out
    ({"out": S.tolist()}, TypeError, "out must be a torch.Tensor"),
    ({"out": torch.zeros(T, E, dtype=torch.float64)}, TypeError, "out must be torch.float32"),
    ({"out": torch.zeros(T, E + 1)}, ValueError, "out must have shape"),
    ({"out": torch.zeros(E, T)}, ValueError, "out must have shape"),
    ({"out": strided(torch.zeros(T, E))}, ValueError, "out must be contiguous"),
    ({"out": torch.zeros(T, E, device=META)}, ValueError, "out must be on cpu"),
    # target and flavor
    ({"target": "cuda"}, ValueError, "target 'cuda'"),
    ({"target": "tpu"}, ValueError, "target must be one of"),
    ({"flavor": "rocm"}, ValueError, "flavor must be one of"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        call(**kwargs)


@pytest.mark.usefixtures("no_kernel")
def test_parallel_entry_always_runs_the_kernel():
    with pytest.raises(ValueError, match="always runs the kernel"):
        moe_topk_gate_backward_parallel(S, IDX, W, G, 1.5, target="torch")
    with pytest.raises(ValueError, match="mask and grad_scores_sum"):
        moe_topk_gate_backward_parallel(S, IDX, W, G, 1.5, mask=MASK)


@pytest.mark.usefixtures("no_kernel")
def test_bad_input_writes_nothing():
    out = torch.full((T, E), 7.0)
    with pytest.raises(ValueError, match="multiple"):
        call(mask=MASK, grad_scores_sum=torch.zeros(5, E), out=out)
    with pytest.raises(TypeError, match="mask must be torch.bool"):
        call(mask=MASK.int(), grad_scores_sum=H, out=out)
    assert bool((out == 7.0).all())


# The kernel runs use the gate's usual size (72 experts, top 6; kernels the other tests compile too).
E_RUN, K_RUN = 72, 6
S_RUN = torch.rand(T, E_RUN, generator=_G) + 0.1
IDX_RUN = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 7, 7, -1, 9, 71], [-1] * 6, [70, 60, 50, 40, 30, 20],
                        [1, 2, 3, -1, -1, -1], [71, 0, 35, 36, 1, 2]])
W_RUN, G_RUN = torch.rand(T, K_RUN, generator=_G), torch.randn(T, K_RUN, generator=_G)
AUX_RUN = {"mask": MASK, "grad_scores_sum": torch.randn(NSEQ, E_RUN, generator=_G)}


def run_kernel(topk_idx, **kwargs):
    return call(S_RUN, topk_idx, W_RUN, G_RUN, target="cpu", **kwargs)


# Ids the kernel must flag: past the experts, below -1, and int64 values whose low 32-bit word
# alone is a valid expert (2**32 + 3) or -1 (2**32 - 1), or whose high word alone is -1.
BAD_IDS = [E_RUN, 2**31 - 1, -2, -(2**31), 2**32 + 3, 2**32 - 1, -(2**32) + 5]


@pytest.mark.parametrize("aux", [False, True])
@pytest.mark.parametrize("bad", BAD_IDS)
def test_kernel_detected_bad_ids(bad: int, aux: bool):
    idx = IDX_RUN.clone()
    idx[4, 1] = bad
    with pytest.raises(ValueError, match=r"outside \[0, num_experts\)"):
        run_kernel(idx, **(AUX_RUN if aux else {}))


def test_kernel_detected_bad_ids_on_any_row():
    # The last row of a partial tile and a token outside the statistic are checked too.
    mask = MASK.clone()
    mask[5] = False
    for row in (0, T - 1):
        idx = IDX_RUN.clone()
        idx[row, 0] = -3
        with pytest.raises(ValueError, match=r"outside \[0, num_experts\)"):
            run_kernel(idx, mask=mask, grad_scores_sum=AUX_RUN["grad_scores_sum"])
    # -1 in every slot, ids 0 and E - 1 are not errors.
    run_kernel(torch.full((T, K_RUN), -1))
    run_kernel(IDX_RUN)


def test_kernel_detected_bad_ids_name_the_argument():
    """The message must name this op's argument ``topk_idx`` (not the forward's
    ``unmapped_topk_idx`` or its fixed routing)."""
    idx = IDX_RUN.clone()
    idx[0, 0] = E_RUN
    with pytest.raises(ValueError) as info:
        run_kernel(idx)
    message = str(info.value)
    assert "topk_idx" in message and "unmapped_topk_idx" not in message, message


@pytest.mark.parametrize("target", ["cpu", "torch"])
@pytest.mark.parametrize("aux", [False, True])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_raise(value: float, aux: bool, target: str):
    """Anywhere in ``scores``: an expert no slot routes to (the kernel's derivative turns it into NaN,
    the reference's into 0), a routed one, the last row of a partial tile, a token outside the
    statistic. The kernel raises after the run and leaves ``out`` as it was; the reference raises
    before computing."""
    mask = MASK.clone()
    mask[5] = False
    for row, expert in ((0, 60), (1, 7), (T - 1, 71), (5, 3)):
        scores = S_RUN.clone()
        scores[row, expert] = value
        out = torch.full((T, E_RUN), 7.0)
        kwargs = {"mask": mask, "grad_scores_sum": AUX_RUN["grad_scores_sum"]} if aux else {}
        with pytest.raises(ValueError, match="scores"):
            call(scores, IDX_RUN, W_RUN, G_RUN, out=out, target=target, **kwargs)
        assert bool((out == 7.0).all())
