"""Every ```` ```python ```` block of the docs runs as written, and where a ```` ```text ```` block
follows it, prints exactly that. Fragments that show a call inside code of the reader's (undefined
names) are fenced ```` ```py ```` and not run. Slow: the examples run at the sizes they show, each
compiling its kernels on a cold cache."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_EXAMPLE = re.compile(r"^```python\n(?P<code>.*?)^```\n(?:\n*```text\n(?P<printed>.*?)^```\n)?", re.M | re.S)


def _examples():
    for page in sorted((ROOT / "docs").glob("**/*.md")):
        for i, match in enumerate(_EXAMPLE.finditer(page.read_text())):
            name = f"{page.relative_to(ROOT / 'docs')}#{i}"
            yield pytest.param(name, match["code"], match["printed"], id=name)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "code", "printed"), list(_examples()))
def test_the_example_runs_and_prints_what_the_page_shows(name, code, printed):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    if printed is not None:
        assert out.getvalue() == printed, f"{name} printed:\n{out.getvalue()}"
