"""``vmi precompile`` and ``vmi cache`` on a private cache directory (never the shared test cache)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from vmi_core.tools import precompile
from vmi_core.tools.cli import main
from vmi_core.tools.registry import discover

# A fresh process runs the op as a server's first call would and prints whether any kernel was
# compiled (fresh) rather than loaded from the cache.
FIRST_CALL = """
from vmi_core.compile import watch_entries
from vmi_core.tools.registry import discover
op = discover()["cast"]
options = op.parse_options([])
with watch_entries() as seen:
    op.run(op.make_inputs((16, 256), options, 0), options, "cpu", "ascend")
print([(e.op, e.target, e.fresh) for e in seen])
"""


def test_precompile_warms_the_kernel_a_first_call_loads_and_cache_clears_it(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("VMI_CACHE_DIR", str(cache))
    (cache / "vmi-0.0.0-0123456789abcdef").mkdir(parents=True)  # another toolchain's key
    (cache / "vmi-0.0.0-0123456789abcdef" / "old.so").write_bytes(b"x" * 100)
    (cache / "not-vmi").mkdir()  # the root may be TileLang's own cache: never touched

    assert main(["precompile", "--target", "cpu", "--ops", "cast", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 variants: 1 compiled, 0 lowered only, 0 cache hits, 1 sharing another's kernels, 0 failed" in out
    assert "the kernels of the ascend flavor" in out

    first = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "[('cast', 'cpu', False)]"

    assert main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert f"cache root   {cache}" in info
    assert "other keys   1 directories" in info
    rows = {line.split()[0]: line.split()[1:] for line in info.splitlines() if line.startswith("  ")}
    assert rows["op"][0] == "cpu" and rows["cast"][0] == "1" and rows["total"] == ["1"]

    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: no question asked
    assert main(["cache", "clear", "--op", "cast"]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert main(["cache", "clear", "--stale", "--yes"]) == 0
    assert not (cache / "vmi-0.0.0-0123456789abcdef").exists()
    assert main(["cache", "clear", "--op", "cast", "--target", "cpu", "--yes"]) == 0
    assert "removed 1 kernel variants (1 cache entries)" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0
    assert "no recorded kernel variants" in capsys.readouterr().out
    assert main(["cache", "clear", "--yes"]) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["not-vmi"]


def write(tmp_path, entries) -> object:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(entries))
    return path


def test_config_entries_become_variants(tmp_path):
    ops = discover()
    path = write(tmp_path, [{"op": "per_token_cast", "options": {"fmt": "e2m1", "round_sf": True}},
                            {"op": "moe_topk_gate_forward", "options": {"num_topk": 6}, "shape": [4096, 384]},
                            {"op": "cast", "flavor": "cuda"}])
    variants = precompile.variants(precompile.load_config(path, ops), ("cpu", "cuda"))
    labels = [(v.op, v.target, v.flavor, v.label(ops[v.op])) for v in variants]
    assert labels == [
        ("per_token_cast", "cpu", "ascend", "fmt=e2m1, round_sf=True"),
        ("per_token_cast", "cpu", "cuda", "fmt=e2m1, round_sf=True"),
        ("per_token_cast", "cuda", "cuda", "fmt=e2m1, round_sf=True"),
        ("moe_topk_gate", "cpu", "ascend", "num_topk=6, shape=4096x384"),
        ("moe_topk_gate", "cpu", "cuda", "num_topk=6, shape=4096x384"),
        ("moe_topk_gate", "cuda", "cuda", "num_topk=6, shape=4096x384"),
        ("cast", "cpu", "cuda", "defaults"),
        ("cast", "cuda", "cuda", "defaults"),
    ]


@pytest.mark.parametrize("entries, message", [
    ({"op": "cast"}, "must be a JSON list"),
    (["cast"], "entry 0: must be an object"),
    ([{"op": "nope"}], "entry 0: unknown op 'nope'"),
    ([{"op": "cast", "opts": {}}], "entry 0: unknown key 'opts'"),
    ([{"op": "cast"}, {"op": "per_token_cast", "options": {"fmt": "e5m2"}}],
     "entry 1 (per_token_cast): option fmt must be one of"),
    ([{"op": "per_token_cast", "options": {"round_sf": 1}}], "option round_sf takes true or false, got 1"),
    ([{"op": "per_token_cast", "options": {"num_per_channels": True}}], "option num_per_channels takes a value"),
    ([{"op": "per_token_cast", "options": {"bogus": 1}}], "per_token_cast has no option 'bogus'"),
    ([{"op": "cast", "shape": [16]}], "shape must be a list of 2 positive integers"),
    ([{"op": "cast", "flavor": "npu"}], "flavor must be one of"),
])
def test_config_mistakes_name_the_file_and_entry(tmp_path, entries, message):
    path = write(tmp_path, entries)
    with pytest.raises(ValueError, match=str(path).replace(".", r"\.")) as error:
        precompile.load_config(path, discover())
    assert message in str(error.value)


def test_precompile_reports_a_bad_config_as_a_usage_error(tmp_path, capsys):
    path = write(tmp_path, [{"op": "cast", "options": {"dtype": "fp64"}}])
    assert main(["precompile", "--target", "cpu", "--from-config", str(path)]) == 2
    assert "entry 0 (cast): option dtype must be one of" in capsys.readouterr().err
