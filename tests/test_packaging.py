"""The wheel holds one top-level package, recurlen (callbacks and experiments inside it), and a non-editable
install finds its experiments without a source checkout or a particular directory."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel` builds from a copy of the checkout (a build/ left in the checkout by an earlier
    build would otherwise bring files that no longer exist into it)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".cache", ".*_cache", "lightning_logs"))
    subprocess.run([*PIP, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(root / "wheels")],
                   check=True, cwd=root, capture_output=True)
    (found,) = (root / "wheels").glob("recurlen-*.whl")
    return found


def test_wheel_holds_only_the_recurlen_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"recurlen"}, sorted(tops)
    info = next(t for t in tops if t.endswith(".dist-info"))
    assert zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split() == ["recurlen"]

    def files(folder: str, pattern: str) -> set[str]:
        return {p.relative_to(REPO / folder).as_posix() for p in (REPO / folder).rglob(pattern)
                if "__pycache__" not in p.parts}

    def shipped(prefix: str, suffix: str) -> set[str]:
        return {n[len(prefix):] for n in names if n.startswith(prefix) and n.endswith(suffix)}

    # The checkout's callbacks/ is recurlen.callbacks; recurlen's modules are the checkout's, no more, no fewer.
    assert shipped("recurlen/callbacks/", ".py") == files("callbacks", "*.py")
    assert "__init__.py" in shipped("recurlen/callbacks/", ".py")
    assert {n for n in shipped("recurlen/", ".py") if not n.startswith("callbacks/")} == files("recurlen", "*.py")
    # Every experiment file, in its folder, inside the package.
    assert shipped("recurlen/experiments/", ".yaml") == files("experiments", "*.yaml")
    assert "finetune.yaml" in shipped("recurlen/experiments/", ".yaml")


@pytest.mark.slow
def test_installed_wheel_finds_its_experiments(tmp_path, wheel):
    target = tmp_path / "site"
    subprocess.run([*PIP, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RECURLEN_EXPERIMENTS"}
    env["PYTHONPATH"] = str(target)  # ahead of the editable install of this checkout
    code = ("import recurlen; from recurlen.training.experiments.compose import experiments_dir, load_experiment; "
            "print(recurlen.__file__); print(experiments_dir()); "
            "print(load_experiment(['experiment=demo-posttrain', 'intervention=state_passing'])[0].optim.lr)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True,
                         text=True).stdout.split()
    assert out[0] == str(target / "recurlen" / "__init__.py")
    assert out[1] == str(target / "recurlen" / "experiments")
    assert float(out[2]) == 5e-4  # demo-posttrain's own value, on top of what it inherits
