"""Bad input to topk_gate, normalize_weight and moe_topk_gate_forward.

Argument errors: a clear TypeError/ValueError naming the argument, raised before any
kernel runs (each kernel module's ``launch`` is replaced by one that fails the test).
"meta" tensors stand in for a second device. Bad data only a kernel sees (non-finite
logits of routed tokens, fixed experts out of range, replica counts outside the map):
ValueError after the cpu kernel ran; the same data in tokens that do not use it passes.
"""


import pytest
import torch

from vmi_devkit.cases.moe_cases import GateCase, gate_inputs, physical_map, run_kernel
from vmi_devkit.errors import no_kernel_fixture
from vmi_moe import (
    moe_topk_gate,
    moe_topk_gate_forward,
    moe_topk_gate_forward_parallel,
    normalize_weight,
    normalize_weight_parallel,
    topk_gate,
    topk_gate_parallel,
)

KERNEL_MODULES = ("vmi_moe.kernels.topk_gate", "vmi_moe.kernels.normalize_weight",
                  "vmi_moe.kernels.moe_topk_gate")


no_kernel = no_kernel_fixture(*KERNEL_MODULES, autouse=False)


META = torch.device("meta")
S = torch.zeros(4, 16)
W = torch.rand(4, 6)


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: topk_gate(S.tolist(), 2), TypeError, "scores must be a torch.Tensor"),
    (lambda: topk_gate(S.double(), 2), TypeError, "scores must be torch.float32"),
    (lambda: topk_gate(S.half(), 2), TypeError, "scores must be torch.float32"),
    (lambda: topk_gate(S[0], 2), ValueError, "scores must have shape"),
    (lambda: topk_gate(S.view(2, 2, 16), 2), ValueError, "scores must have shape"),
    (lambda: topk_gate(S.t(), 2), ValueError, "scores must be contiguous"),
    (lambda: topk_gate(S[:, ::2], 2), ValueError, "scores must be contiguous"),
    (lambda: topk_gate(torch.zeros(4, 0), 1), ValueError, "scores must have at least one expert"),
    (lambda: topk_gate(S, 17), ValueError, r"num_topk \(17\) must not exceed the number of experts \(16\)"),
    (lambda: topk_gate(torch.zeros(4, 40), 33), ValueError, "num_topk must be in"),
    (lambda: topk_gate(S, 0), ValueError, "num_topk must be in"),
    (lambda: topk_gate(S, -1), ValueError, "num_topk must be in"),
    (lambda: topk_gate(S, 2.0), TypeError, "num_topk must be an int"),
    (lambda: topk_gate(S, True), TypeError, "num_topk must be an int"),
    (lambda: topk_gate(S, 2, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: topk_gate(S, 2, target="tpu"), ValueError, "target must be one of"),
    (lambda: topk_gate(S, 2, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: topk_gate_parallel(S, 2, target="torch"), ValueError, "always runs the kernel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_topk_gate_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: normalize_weight(W.numpy()), TypeError, "topk_weights must be a torch.Tensor"),
    (lambda: normalize_weight(W.double()), TypeError, "topk_weights must be torch.float32"),
    (lambda: normalize_weight(W.bfloat16()), TypeError, "topk_weights must be torch.float32"),
    (lambda: normalize_weight(W[0]), ValueError, "topk_weights must have shape"),
    (lambda: normalize_weight(W.view(2, 2, 6)), ValueError, "topk_weights must have shape"),
    (lambda: normalize_weight(W.t()), ValueError, "topk_weights must be contiguous"),
    (lambda: normalize_weight(torch.rand(4, 33)), ValueError, "topk_weights must have 1 to 32 columns"),
    (lambda: normalize_weight(torch.rand(4, 0)), ValueError, "topk_weights must have 1 to 32 columns"),
    (lambda: normalize_weight(W, target="ascend"), ValueError, "target 'ascend'"),
    (lambda: normalize_weight(W, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: normalize_weight_parallel(W, target="torch"), ValueError, "always runs the kernel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_normalize_weight_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- moe_topk_gate_forward --------------------------------------------------------------------

T_, E_, K_ = 8, 16, 4
LOGITS = torch.zeros(T_, E_)
FLAGS = torch.zeros(T_, dtype=torch.bool)
MAP, COUNT = physical_map(E_ + 2, 3, 0)
IDX = torch.zeros(T_, K_, dtype=torch.int64)


def gate(logits=LOGITS, k=K_, shared=False, num_shared=0, scale=1.5, ep_rank=0, **kwargs):
    return moe_topk_gate_forward(logits, k, shared, num_shared, scale, ep_rank, **kwargs)


def mapped(**kwargs):
    """Two shared experts appended, with the replica map of E + 2 logical experts."""
    return gate(shared=True, num_shared=2, **{"to_physical_map": MAP, "logical_count": COUNT, **kwargs})


OUT = (torch.zeros(T_, K_, dtype=torch.int64), torch.zeros(T_, K_))


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("call", "error", "match"), [
    # scoring function, logits, top-k, shared experts, scalars
    (lambda: gate(scoring_func="sigmoid"), ValueError, "scoring_func must be one of"),
    (lambda: gate(scoring_func="softmax"), ValueError, "scoring_func must be one of"),
    (lambda: gate(logits=LOGITS.numpy()), TypeError, "logits must be a torch.Tensor"),
    (lambda: gate(logits=LOGITS.double()), TypeError, "logits must be torch.float32"),
    (lambda: gate(logits=LOGITS.bfloat16()), TypeError, "logits must be torch.float32"),
    (lambda: gate(logits=LOGITS[0]), ValueError, "logits must have shape"),
    (lambda: gate(logits=LOGITS.t()), ValueError, "logits must be contiguous"),
    (lambda: gate(logits=torch.zeros(T_, 0)), ValueError, "logits must have at least one expert"),
    (lambda: gate(k=E_ + 1), ValueError, r"num_topk \(17\) must not exceed the number of experts \(16\)"),
    (lambda: gate(logits=torch.zeros(T_, 64), k=33), ValueError, "num_topk must be in"),
    (lambda: gate(k=0), ValueError, "num_topk must be in"),
    (lambda: gate(k=4.0), TypeError, "num_topk must be an int"),
    (lambda: gate(shared=True, num_shared=0), ValueError, "num_shared_experts must be 1 or 2"),
    (lambda: gate(shared=True, num_shared=3), ValueError, "num_shared_experts must be 1 or 2"),
    (lambda: gate(shared=True, num_shared=-1), ValueError, "num_shared_experts must be"),
    (lambda: gate(shared=1, num_shared=1), TypeError, "use_shared_as_routed must be a bool"),
    (lambda: gate(num_shared=1.0), TypeError, "num_shared_experts must be an int"),
    (lambda: gate(scale="1.5"), TypeError, "routed_scaling_factor must be a float"),
    (lambda: gate(ep_rank=-1), ValueError, "ep_rank must be"),
    (lambda: gate(ep_rank=2**31), ValueError, "ep_rank must be"),
    (lambda: gate(ep_rank=0.0), TypeError, "ep_rank must be an int"),
    # bias, image bias
    (lambda: gate(bias=torch.zeros(E_ - 1)), ValueError, "bias must have shape"),
    (lambda: gate(bias=torch.zeros(E_ + 1)), ValueError, "bias must have shape"),
    (lambda: gate(bias=torch.zeros(1, E_)), ValueError, "bias must have shape"),
    (lambda: gate(bias=torch.zeros(E_, dtype=torch.float64)), TypeError, "bias must be torch.float32"),
    (lambda: gate(bias=torch.zeros(2 * E_)[::2]), ValueError, "bias must be contiguous"),
    (lambda: gate(bias=torch.zeros(E_, device=META)), ValueError, "bias must be on cpu"),
    (lambda: gate(image_bias=torch.zeros(E_)), ValueError, "image_bias and image_token_mask must be given together"),
    (lambda: gate(image_token_mask=FLAGS), ValueError, "image_bias and image_token_mask must be given together"),
    (lambda: gate(image_bias=torch.zeros(E_ - 1), image_token_mask=FLAGS), ValueError, "image_bias must have shape"),
    (lambda: gate(image_bias=torch.zeros(E_).half(), image_token_mask=FLAGS), TypeError,
     "image_bias must be torch.float32"),
    (lambda: gate(image_bias=torch.zeros(E_, device=META), image_token_mask=FLAGS), ValueError,
     "image_bias must be on cpu"),
    (lambda: gate(image_bias=torch.zeros(E_), image_token_mask=FLAGS.int()), TypeError,
     "image_token_mask must be torch.bool"),
    (lambda: gate(image_bias=torch.zeros(E_), image_token_mask=FLAGS[1:]), ValueError,
     "image_token_mask must have one element per token"),
    (lambda: gate(image_bias=torch.zeros(2 * E_)[::2], image_token_mask=FLAGS), ValueError,
     "image_bias must be contiguous"),
    (lambda: gate(image_bias=torch.zeros(E_), image_token_mask=torch.zeros(T_, 2, dtype=torch.bool)[:, 1]),
     ValueError, "image_token_mask must be contiguous"),
    (lambda: gate(image_bias=torch.zeros(E_), image_token_mask=FLAGS.to(META)), ValueError,
     "image_token_mask must be on cpu"),
    # per-token flags
    (lambda: gate(mask=FLAGS.tolist()), TypeError, "mask must be a torch.Tensor"),
    (lambda: gate(mask=FLAGS.to(torch.uint8)), TypeError, "mask must be torch.bool"),
    (lambda: gate(mask=torch.zeros(T_ + 1, dtype=torch.bool)), ValueError, "mask must have one element per token"),
    (lambda: gate(mask=torch.zeros(2 * T_, dtype=torch.bool)[::2]), ValueError, "mask must be contiguous"),
    (lambda: gate(mask=torch.zeros(T_, dtype=torch.bool, device=META)), ValueError, "mask must be on cpu"),
    (lambda: gate(force_random=FLAGS.float()), TypeError, "force_random must be torch.bool"),
    (lambda: gate(force_random=FLAGS[:-1]), ValueError, "force_random must have one element per token"),
    (lambda: gate(force_random=torch.zeros(T_, 2, dtype=torch.bool)[:, 0]), ValueError,
     "force_random must be contiguous"),
    (lambda: gate(force_random=FLAGS.to(META)), ValueError, "force_random must be on cpu"),
    # fixed routing
    (lambda: gate(fix_routing_mask=FLAGS), ValueError, "fix_routing_mask requires unmapped_topk_idx"),
    (lambda: gate(fix_routing_mask=FLAGS.int(), unmapped_topk_idx=IDX), TypeError,
     "fix_routing_mask must be torch.bool"),
    (lambda: gate(fix_routing_mask=FLAGS[:4], unmapped_topk_idx=IDX), ValueError,
     "fix_routing_mask must have one element per token"),
    (lambda: gate(fix_routing_mask=torch.zeros(T_, 2, dtype=torch.bool)[:, 0], unmapped_topk_idx=IDX), ValueError,
     "fix_routing_mask must be contiguous"),
    (lambda: gate(fix_routing_mask=FLAGS.to(META), unmapped_topk_idx=IDX), ValueError,
     "fix_routing_mask must be on cpu"),
    (lambda: gate(unmapped_topk_idx=IDX.int()), TypeError, "unmapped_topk_idx must be torch.int64"),
    (lambda: gate(unmapped_topk_idx=IDX[:, :2]), ValueError, "unmapped_topk_idx must have shape"),
    (lambda: gate(unmapped_topk_idx=IDX[:4]), ValueError, "unmapped_topk_idx must have shape"),
    (lambda: gate(unmapped_topk_idx=IDX.t().contiguous().t()), ValueError,
     "unmapped_topk_idx must have unit column stride"),
    (lambda: gate(unmapped_topk_idx=torch.zeros(K_, dtype=torch.int64).expand(T_, K_)), ValueError,
     "unmapped_topk_idx must have unit column stride and non-overlapping rows"),
    (lambda: gate(unmapped_topk_idx=IDX.to(META)), ValueError, "unmapped_topk_idx must be on cpu"),
    # replica map
    (lambda: mapped(logical_count=None), ValueError, "to_physical_map and logical_count must be given together"),
    (lambda: mapped(to_physical_map=None), ValueError, "to_physical_map and logical_count must be given together"),
    (lambda: mapped(to_physical_map=MAP.long()), TypeError, "to_physical_map must be torch.int32"),
    (lambda: mapped(to_physical_map=MAP[:-1]), ValueError, "to_physical_map must have shape"),
    (lambda: mapped(to_physical_map=MAP.reshape(-1)), ValueError, "to_physical_map must have shape"),
    (lambda: mapped(to_physical_map=MAP.t().contiguous().t()), ValueError, "to_physical_map must be contiguous"),
    (lambda: mapped(to_physical_map=MAP[:, :0]), ValueError, "to_physical_map must have at least one replica"),
    (lambda: mapped(to_physical_map=MAP.to(META)), ValueError, "to_physical_map must be on cpu"),
    (lambda: mapped(logical_count=COUNT.long()), TypeError, "logical_count must be torch.int32"),
    (lambda: mapped(logical_count=COUNT[:-1]), ValueError, "logical_count must have shape"),
    (lambda: mapped(logical_count=COUNT.to(META)), ValueError, "logical_count must be on cpu"),
    (lambda: mapped(logical_count=torch.zeros(2 * (E_ + 2), dtype=torch.int32)[::2]), ValueError,
     "logical_count must be contiguous"),
    (lambda: gate(to_physical_map=MAP, logical_count=COUNT), ValueError, "to_physical_map must have shape"),
    # outputs
    (lambda: gate(out=OUT[0]), TypeError, r"out must be a \(topk_idx, topk_weights\) tuple"),
    (lambda: gate(out=(OUT[0],)), TypeError, r"out must be a \(topk_idx, topk_weights\) tuple"),
    (lambda: gate(out=(*OUT, OUT[0])), TypeError, r"out must be a \(topk_idx, topk_weights\) tuple"),
    (lambda: gate(out=(OUT[0].int(), OUT[1])), TypeError, r"out\[0\] \(topk_idx\) must be torch.int64"),
    (lambda: gate(out=(OUT[0], OUT[1].double())), TypeError, r"out\[1\] \(topk_weights\) must be torch.float32"),
    (lambda: gate(out=(OUT[0][:, :3], OUT[1])), ValueError, r"out\[0\] \(topk_idx\) must have shape"),
    (lambda: mapped(out=OUT), ValueError, r"out\[0\] \(topk_idx\) must have shape \(8, 6\)"),
    (lambda: gate(out=(OUT[0], OUT[1].t().contiguous().t())), ValueError,
     r"out\[1\] \(topk_weights\) must be contiguous"),
    (lambda: gate(out=(OUT[0].to(META), OUT[1])), ValueError, r"out\[0\] \(topk_idx\) must be on cpu"),
    (lambda: gate(out=(OUT[0], OUT[1].to(META))), ValueError, r"out\[1\] \(topk_weights\) must be on cpu"),
    (lambda: gate(out=(OUT[0].t().contiguous().t(), OUT[1])), ValueError,
     r"out\[0\] \(topk_idx\) must be contiguous"),
    (lambda: gate(scores=torch.zeros(T_, E_ + 1)), ValueError, "scores must have shape"),
    (lambda: gate(scores=torch.zeros(T_, E_, dtype=torch.float64)), TypeError, "scores must be torch.float32"),
    (lambda: gate(scores=torch.zeros(E_, T_).t()), ValueError, "scores must be contiguous"),
    (lambda: gate(scores=torch.zeros(T_, E_, device=META)), ValueError, "scores must be on cpu"),
    # targets
    (lambda: gate(target="cuda"), ValueError, "target 'cuda'"),
    (lambda: gate(flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: moe_topk_gate(LOGITS, K_, False, 0, 1.5, 0, scoring_func="sigmoid"), ValueError, "scoring_func"),
    (lambda: moe_topk_gate_forward_parallel(LOGITS, K_, False, 0, 1.5, 0, target="torch"), ValueError,
     "always runs the kernel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_gate_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.usefixtures("no_kernel")
def test_no_launch_and_no_write_for_zero_tokens():
    out = (torch.zeros(0, K_, dtype=torch.int64), torch.zeros(0, K_))
    idx, weights = gate(logits=torch.zeros(0, E_), out=out)
    assert idx is out[0] and weights is out[1]
    assert tuple(topk_gate(torch.zeros(0, E_), 3).shape) == (0, 3)
    d, n = normalize_weight(torch.zeros(0, 5))
    assert tuple(d.shape) == (0,) and tuple(n.shape) == (0, 5)


# --- bad data the kernels detect ---------------------------------------------------------------

CHECKED = GateCase(72, 6, S=2, dup=3, flavor="ascend", mask=True, fixed=True, force=True)


def checked_inputs(num_tokens: int = 40):
    inp = gate_inputs(CHECKED, num_tokens, 70, ties=False)
    inp.options["mask"] = torch.arange(num_tokens) % 4 != 1  # token 1 masked
    inp.options["force_random"] = torch.arange(num_tokens) % 4 == 2  # token 2 force-random
    fixed = torch.arange(num_tokens) % 4 == 3  # token 3 fixed
    inp.options["fix_routing_mask"] = fixed
    return inp


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("token", [0, 3, 39])
def test_nonfinite_logits_of_a_routed_token(value: float, token: int):
    inp = checked_inputs()
    inp.logits[token, 5] = value
    with pytest.raises(ValueError, match="logits contains non-finite values"):
        run_kernel(CHECKED, inp)


def test_nonfinite_logits_of_unrouted_tokens_are_ignored():
    inp = checked_inputs()
    inp.logits[1] = float("nan")  # masked
    inp.logits[2, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])  # force-random
    idx, weights, unmapped, sc = run_kernel(CHECKED, inp)
    assert bool((idx[1] == -1).all()) and bool((unmapped[[1, 2]] == -1).all())
    assert bool(torch.isfinite(weights).all()) and bool(torch.isfinite(sc).all())


@pytest.mark.parametrize("bad", [-1, CHECKED.E, CHECKED.E + 100, 2**32, -(2**40)])
def test_fixed_expert_out_of_range(bad: int):
    inp = checked_inputs()
    inp.options["unmapped_topk_idx"][3, 2] = bad
    with pytest.raises(ValueError, match=r"unmapped_topk_idx holds fixed-routing experts outside \[0, num_experts\)"):
        run_kernel(CHECKED, inp)


def test_out_of_range_experts_of_tokens_without_fixed_routing_are_ignored():
    inp = checked_inputs()
    for t in (0, 1, 2):  # routed but not fixed, masked, force-random
        inp.options["unmapped_topk_idx"][t] = -7
    inp.options["unmapped_topk_idx"][4, 0] = 10**6  # token 4 is routed, not fixed
    _, _, unmapped, _ = run_kernel(CHECKED, inp)
    assert bool((unmapped[[1, 2]] == -1).all())
    assert bool(((unmapped[[0, 4]] >= 0) & (unmapped[[0, 4]] < CHECKED.E)).all())


@pytest.mark.parametrize("count", [0, 4, -1])
def test_replica_count_outside_the_map(count: int):
    inp = checked_inputs()
    # The first shared expert is in every routed token's output.
    inp.options["logical_count"] = inp.options["logical_count"].clone()
    inp.options["logical_count"][CHECKED.E] = count
    match = r"logical_count holds replica counts outside \[1, to_physical_map.size\(1\)\]"
    with pytest.raises(ValueError, match=match):
        run_kernel(CHECKED, inp)


def test_topk_gate_rejects_non_finite_scores():
    x = torch.randn(40, 72)
    assert tuple(topk_gate(x, 6, target="cpu").shape) == (40, 6)
    for value in (float("-inf"), float("inf"), float("nan")):
        bad = x.clone()
        bad[37, 71] = value
        with pytest.raises(ValueError, match="scores contains non-finite values"):
            topk_gate(bad, 6, target="cpu")
