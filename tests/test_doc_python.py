"""Every ```python block of README.md and docs/python-api.md (the pages of runnable Python; other pages quote
fragments) runs as written, in a fresh process, in a directory where each run directory it names ("runs/...")
holds a tiny run of that intervention (the demo's layout, trained in seconds)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recurlen.training.finetune import run_finetune
from recurlen.training.interventions import INTERVENTIONS

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[tuple[str, str]]:
    """(where, code) of every python block, README first."""
    out = []
    for page in (ROOT / "README.md", ROOT / "docs" / "python-api.md"):
        for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}", code))
    return out


BLOCKS = python_blocks()


def test_the_python_page_has_its_example():
    assert "docs/python-api.md#1" in [where for where, _ in BLOCKS]


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs(tmp_path, experiment, where, code):
    for run in sorted(set(re.findall(r"[\"'](runs/[^\"']+)[\"']", code))):
        name = Path(run).name
        run_finetune(experiment(tmp_path / run, f"intervention={name if name in INTERVENTIONS else 'none'}"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
    if where == "docs/python-api.md#1":  # what the example prints: every bin up to 4T with full - reset
        bins = re.findall(r"^\s*(\S+)\s+ppl\s+[\d.]+\s+full - reset [+-]\d\.\d{3}$", done.stdout, re.M)
        assert bins == ["[0,T)", "[T,2T)", "[2T,4T)"], done.stdout
