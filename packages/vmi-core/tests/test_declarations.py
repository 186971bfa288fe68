"""The declaration helpers every op uses: ``parallel_entry``, ``Kernel`` and ``support``."""

from __future__ import annotations

import inspect

import pytest
import torch

from vmi_core.kernel import Kernel, kernel
from vmi_core.library import parallel_entry, support
from vmi_core.targets import TARGETS


def scale(x: torch.Tensor, factor: float = 2.0, *, target: str | None = None, flavor: str | None = None):
    """Doubles ``x``."""
    return x * factor, target, flavor


scale_parallel = parallel_entry(scale, "x")


def test_parallel_entry_has_the_public_signature_and_calls_it():
    assert inspect.signature(scale_parallel) == inspect.signature(scale)
    assert scale_parallel.__name__ == "scale_parallel" and scale_parallel.__module__ == __name__
    assert scale_parallel.parallel_of is scale
    assert "``scale``" in scale_parallel.__doc__
    x = torch.ones(3)
    out, target, flavor = scale_parallel(x, 3.0, target="cpu", flavor="cuda")
    assert torch.equal(out, x * 3) and (target, flavor) == ("cpu", "cuda")


def test_parallel_entry_refuses_the_reference(vmi_env):
    x = torch.ones(3)
    with pytest.raises(ValueError, match="scale_parallel always runs the kernel"):
        scale_parallel(x, target="torch")
    with pytest.raises(ValueError, match="scale_parallel always runs the kernel"):
        scale_parallel(torch.ones(3, device="meta"))
    vmi_env.setenv("VMI_TARGET", "torch")
    with pytest.raises(ValueError, match="scale_parallel always runs the kernel"):
        scale_parallel(x)


def test_parallel_entry_names_a_real_parameter():
    with pytest.raises(ValueError, match="no parameter 'y'"):
        parallel_entry(scale, "y")


def test_kernel_declaration():
    def build_double(spec, target):
        return ("prim_func", spec, target)

    plain = kernel(build_double)
    configured = kernel(simd_parallel=False, simt_8bit=True)(build_double)
    by_spec = kernel(config=lambda spec: {"simt_8bit": spec > 1})(build_double)
    assert isinstance(plain, Kernel) and plain.name == "double"
    assert plain(4, "cpu") == ("prim_func", 4, "cpu")
    assert plain.config_of(4) == {}
    assert configured.config_of(4) == {"simd_parallel": False, "simt_8bit": True}
    assert by_spec.config_of(1) == {"simt_8bit": False} and by_spec.config_of(2) == {"simt_8bit": True}


def test_kernel_launch_rows(monkeypatch):
    compiled = []
    monkeypatch.setattr("vmi_core.kernel.cached_kernel", lambda build, spec, target, **config: compiled.append(spec)
                        or (lambda start, stop: ran.append((start, stop))))
    ran = []
    double = kernel(lambda spec, target: None)
    double.launch_rows(3, "ascend-sim", 0, lambda k, start, stop: k(start, stop))
    assert compiled == [] and ran == []
    double.launch_rows(3, "ascend-sim", 100, lambda k, start, stop: k(start, stop))
    assert compiled == [3] and ran == [(0, 100)]
    ran.clear()
    double.launch_rows(3, "cpu", 100, lambda k, start, stop: k(start, stop), align=8, min_rows=1)
    assert sorted(ran)[0][0] == 0 and sorted(ran)[-1][1] == 100
    assert all(start % 8 == 0 for start, _ in ran)


def test_support_covers_every_target():
    table = support("SIMD and SIMT vector regions", cpu="bit-exact, every option")
    assert set(table) == set(TARGETS) - {"cuda"}  # the cuda line is the family record's (test_cuda_record)
    assert table["ascend"] == "lowers to AscendC (SIMD and SIMT vector regions); runs on ascend-sim, not yet on an NPU"
    assert table["cpu"] == "runs; bit-exact, every option"
