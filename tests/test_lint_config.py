"""`make lint`'s repeated-code check: pylint with the project's configuration reports six similar lines in two
files, and nothing for five or for anything else (it is the one pylint check recurlen runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = [f"    total += values[{i}] * {i + 2}" for i in range(6)]


def _package(tmp_path: Path, shared_lines: int) -> Path:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("first", "second"):  # no docstrings, one-letter names: only duplicate-code may speak
        body = "\n".join(SHARED[:shared_lines])
        (package / f"{name}.py").write_text(f"def {name}_x(values):\n    total = 0\n{body}\n    return total + "
                                            f"{len(name)}\n")
    return package


@pytest.mark.parametrize(("shared_lines", "reported"), [(6, True), (5, False)])
def test_pylint_reports_six_repeated_lines_and_nothing_else(tmp_path, shared_lines, reported):
    package = _package(tmp_path, shared_lines)
    done = subprocess.run([sys.executable, "-m", "pylint", "--rcfile", str(ROOT / "pyproject.toml"), str(package)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    codes = {word.rstrip(":") for line in done.stdout.splitlines() for word in line.split()
             if word[:1] in "CRWEF" and word[1:5].isdigit()}
    assert codes == ({"R0801"} if reported else set()), done.stdout
    assert (done.returncode != 0) == reported, done.stdout


def test_make_lint_runs_the_check_over_the_package():
    out = subprocess.run(["make", "-n", "lint"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert any(line.split()[-4:] == ["-m", "pylint", "recurlen", "callbacks"] for line in out.splitlines()), out
