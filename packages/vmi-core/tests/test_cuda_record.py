"""The cuda gate: a kernel launches only if its source passed on a GPU (vmi_core.cuda_record).

No GPU here: the compiled kernel is stood in for by an object with the real generated CUDA source
(``Kernel.source``), so the gate sees exactly what a GPU host would hash.
"""

from __future__ import annotations

import pytest
import tilelang.language as T

from vmi_core import cuda_record
from vmi_core import kernel as kernel_module
from vmi_core.cuda_record import OPT_IN_ENV, UnverifiedKernelError, source_digest
from vmi_core.kernel import kernel
from vmi_core.tools import devicecheck


@kernel
def build_copy(n: int, target: str):
    @T.prim_func
    def copy_kernel(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(n):
                Y[i] = X[i]

    return copy_kernel


class _Compiled:
    """A stand-in for the compiled cuda kernel: only its source matters to the gate."""

    def __init__(self, source: str):
        self.source = source

    def get_kernel_source(self) -> str:
        return self.source


@pytest.fixture(scope="module")
def sources() -> dict[int, str]:
    return {n: build_copy.source(n, "cuda") for n in (256, 512)}


@pytest.fixture
def gate(monkeypatch, sources):
    """Launch ``build_copy`` on cuda against a record the test sets (``gate.record``)."""
    monkeypatch.delenv(OPT_IN_ENV, raising=False)
    monkeypatch.setattr(cuda_record, "_passed", set())
    monkeypatch.setattr(kernel_module, "cached_kernel", lambda build, spec, target, **config: _Compiled(sources[spec]))
    records = {"runs": {"h200-test": {"gpu": "NVIDIA H200", "date": "2026-12-01"}}, "ops": {}, "kernels": {}}
    monkeypatch.setattr(cuda_record, "family_record", lambda package: records)
    return records


def _entry(result: str, **extra) -> dict:
    return {"kernel": "test_cuda_record.build_copy", "spec": "256", "ops": ["copy"], "run": "h200-test",
            "result": result, **extra}


def test_the_sources_differ_by_specialisation(sources) -> None:
    assert source_digest(sources[256]) != source_digest(sources[512])


def test_an_unrecorded_kernel_is_refused_and_told_how_to_verify(gate) -> None:
    with pytest.raises(UnverifiedKernelError) as refused:
        build_copy.compiled(256, "cuda")
    message = str(refused.value)
    for part in ("build_copy", "(256)", "has not run on a GPU", "scripts/gpu-check", f"{OPT_IN_ENV}=1"):
        assert part in message


def test_a_recorded_pass_unlocks_exactly_that_source(gate, sources) -> None:
    gate["kernels"][source_digest(sources[256])] = _entry("pass")
    assert build_copy.compiled(256, "cuda").source == sources[256]
    # Another specialisation is another source: still refused.
    with pytest.raises(UnverifiedKernelError):
        build_copy.compiled(512, "cuda")


def test_a_changed_source_relocks(gate, sources, monkeypatch) -> None:
    gate["kernels"][source_digest(sources[256])] = _entry("pass")
    changed = sources[256] + "// one more line\n"
    monkeypatch.setattr(kernel_module, "cached_kernel", lambda build, spec, target, **config: _Compiled(changed))
    with pytest.raises(UnverifiedKernelError, match="has not run on a GPU at its current source"):
        build_copy.compiled(256, "cuda")


def test_a_recorded_failure_is_refused_with_what_failed(gate, sources) -> None:
    gate["kernels"][source_digest(sources[256])] = _entry("fail", detail="copy defaults at 256: 3 mismatches")
    with pytest.raises(UnverifiedKernelError, match=r"failed on NVIDIA H200 \(2026-12-01\): copy defaults at 256"):
        build_copy.compiled(256, "cuda")


def test_the_opt_in_launches_and_recording_sees_every_launch(gate, sources, monkeypatch) -> None:
    monkeypatch.setenv(OPT_IN_ENV, "1")
    with cuda_record.recording() as launched:
        build_copy.compiled(256, "cuda")
        build_copy.compiled(512, "cuda")
    assert [launch["digest"] for launch in launched] == [source_digest(sources[n]) for n in (256, 512)]
    assert {launch["kernel"] for launch in launched} == {f"{__name__}.build_copy"}


def test_other_targets_are_not_gated(gate) -> None:
    assert isinstance(build_copy.compiled(256, "cpu"), _Compiled)


def _case(status: str, digests: list[str], options: str = "defaults") -> dict:
    case = {"options": options, "shape": [4, 256], "status": status,
            "launched": [{"package": "vmi_x", "kernel": "vmi_x.kernels.k.build_k", "spec": d, "digest": d}
                         for d in digests]}
    if status != "pass":
        case["detail"] = ["1 mismatch"]
    return case


def test_the_check_records_a_kernel_as_passed_only_if_every_case_that_ran_it_passed(monkeypatch) -> None:
    monkeypatch.setattr(cuda_record, "family_record", lambda package: {"runs": {}, "ops": {}, "kernels": {
        "old": {"kernel": "k", "spec": "s", "ops": ["a"], "run": "older", "result": "pass"}}})
    report = {"environment": {"gpu": "NVIDIA H200", "vmi_commit": "0123456789abcdef", "vmi_source": "tree",
                              "torch": "t", "cuda": "c", "nvcc": "n", "tilelang": "tl", "arch": "sm_90a"},
              "ops": {"a": {"criterion": "bit for bit", "cases": [_case("pass", ["d1", "d2"]), _case("pass", ["d1"])]},
                      "b": {"criterion": "bit for bit", "cases": [
                          _case("pass", ["d2"]), _case("fail", ["d3", "d2"], "x=1"), _case("rejected", ["d4"])]}}}
    ops = {name: type("Op", (), {"family": "x"})() for name in ("a", "b")}
    record = devicecheck.updated_records(report, ops)["vmi_x"]
    (run_id,) = record["runs"]
    assert record["runs"][run_id]["commit"] == "0123456789abcdef"
    kernels = record["kernels"]
    assert kernels["d1"]["result"] == "pass" and kernels["d1"]["ops"] == ["a"]
    assert kernels["d2"]["result"] == "fail" and kernels["d2"]["ops"] == ["a", "b"]
    assert kernels["d3"]["result"] == "fail" and "b x=1 at 4x256: 1 mismatch" in kernels["d3"]["detail"]
    assert "d4" not in kernels  # a rejected case ran nothing that counts
    assert kernels["old"]["run"] == "older"  # earlier runs' kernels stay
    assert record["ops"]["a"]["summary"] == "2/2 cases pass (bit for bit)"
    assert record["ops"]["b"]["summary"].startswith("1/2 cases pass (bit for bit); first fail: x=1 at 4x256")


def test_the_support_line_says_what_the_last_run_showed(monkeypatch) -> None:
    record = {"runs": {"r": {"gpu": "NVIDIA H200", "date": "2026-12-01", "commit": "abc"}},
              "ops": {"a": {"run": "r", "summary": "2/2 cases pass"}, "b": {"run": "r", "summary": "0/2 cases pass"}},
              "kernels": {"d": {"kernel": "k", "spec": "s", "ops": ["a"], "run": "r", "result": "pass"},
                          "e": {"kernel": "k", "spec": "t", "ops": ["b"], "run": "r", "result": "fail"}}}
    monkeypatch.setattr(cuda_record, "family_record", lambda package: record)
    assert cuda_record.op_status("vmi_x", "a") == (
        f"last GPU run (NVIDIA H200, 2026-12-01, abc): 2/2 cases pass; launches only the kernel sources that "
        f"passed there (opt in: {OPT_IN_ENV}=1)")
    assert "0/2 cases pass; none of its kernel sources passed, so launches are refused" in \
        cuda_record.op_status("vmi_x", "b")
    record["kernels"].clear()
    assert "2/2 cases pass; its kernel sources were not recorded, so launches are refused" in \
        cuda_record.op_status("vmi_x", "a")
    assert "never run on a GPU, so launches are refused" in cuda_record.op_status("vmi_x", "c")
