"""A non-editable install finds its experiments without a source checkout or a particular directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_the_experiments(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-w", str(wheels)], check=True,
                   cwd=tmp_path)
    (wheel,) = wheels.glob("recurlen-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, cwd=tmp_path)
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
