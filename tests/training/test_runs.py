"""The run directory: layout, resume discovery, reading a run's config, and the atomic writer under it all."""

import json
import os
import time

import pytest
import torch

from recurlen.training.run_dir import RUN_META_KEY, RunDir, check_resume, load_model, run_config, run_dir_of
from recurlen.util.atomic_files import atomic_write, json_safe, write_json


def test_layout_names(tmp_path):
    run = RunDir(tmp_path / "r")
    assert run.last_checkpoint == tmp_path / "r" / "checkpoints" / "last.ckpt"
    assert run.config_file == tmp_path / "r" / "config.yaml"
    assert run.fitted_noise == tmp_path / "r" / "fitted_noise.pt"
    assert run.tensorboard == tmp_path / "r" / "tb"
    assert run.rank_summary(3) == tmp_path / "r" / "ranks" / "rank3.json"
    assert not run.has_checkpoint() and not (tmp_path / "r").exists()  # naming a run creates nothing


def test_resume_discovery_picks_the_newest(tmp_path):
    run = RunDir(tmp_path)
    assert run.resume_checkpoint("auto") is None and run.resume_checkpoint("never") is None
    run.checkpoints.mkdir()
    step, last, hpc = run.checkpoints / "step=000100.ckpt", run.last_checkpoint, tmp_path / "hpc_ckpt_1.ckpt"
    for i, p in enumerate((step, last)):
        p.write_bytes(b"x")
        os.utime(p, (time.time() + i, time.time() + i))
    assert run.resume_checkpoint("auto") == str(last)
    hpc.write_bytes(b"x")  # SLURM pre-emption checkpoint, written later
    os.utime(hpc, (time.time() + 5, time.time() + 5))
    assert run.resume_checkpoint("auto") == str(hpc)
    assert run.resume_checkpoint("never") is None
    assert run.resume_checkpoint(str(step)) == str(step)
    with pytest.raises(FileNotFoundError, match="no such checkpoint file"):
        run.resume_checkpoint(str(tmp_path / "gone.ckpt"))


@pytest.mark.parametrize("value", ["atuo", "latest", "runs/x/checkpoints"])
def test_bad_resume_values_are_refused_when_the_config_is_built(value):
    with pytest.raises(ValueError, match=r"resume=.*allowed.*'auto', 'never'"):
        check_resume(value)
    from recurlen.training.experiments.compose import load_experiment

    with pytest.raises(ValueError, match="resume="):
        load_experiment([f"resume={value}"])


def test_run_config_comes_from_config_yaml_not_the_checkpoint(tmp_path):
    run = RunDir(tmp_path / "r")
    run.save_config({"name": "x", "data": {"seq_len": 32, "source": "embedded"}})
    run.checkpoints.mkdir(parents=True)
    run.last_checkpoint.write_bytes(b"not a torch file")  # would fail if it were torch.load-ed
    for path in (run.path, run.last_checkpoint):
        assert run_dir_of(path).path == run.path
        assert run_config(path)["data"] == {"seq_len": 32, "source": "embedded"}
    assert run_dir_of(tmp_path / "elsewhere.ckpt") is None and run_config(tmp_path) is None


def test_a_checkpoint_outside_its_run_keeps_its_config_readable(tmp_path):
    ckpt = tmp_path / "moved.ckpt"
    torch.save({"hyper_parameters": {"data": {"seq_len": 8}}, "state_dict": {}}, ckpt)
    assert run_config(ckpt) == {"data": {"seq_len": 8}}


def test_load_model_says_what_a_foreign_lightning_checkpoint_lacks(tmp_path):
    ckpt = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    with pytest.raises(ValueError, match=f"without recurlen metadata \\(key {RUN_META_KEY!r}\\)"):
        load_model(str(ckpt))


def test_atomic_write_leaves_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "sub" / "results.json"
    write_json(path, {"a": 1})

    def torn(p):
        p.write_text('{"a": ')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        atomic_write(path, torn)
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]  # no temporary left behind


def test_concurrent_writers_use_distinct_temporaries(tmp_path):
    path, seen = tmp_path / "f.txt", []

    def inner(p):
        seen.append(p)
        atomic_write(path, lambda q: (seen.append(q), q.write_text("inner")))  # a second writer mid-write
        p.write_text("outer")

    atomic_write(path, inner)
    assert len(seen) == 2 and seen[0] != seen[1]
    assert path.read_text() == "outer"


def test_json_with_non_finite_numbers_is_strict_json(tmp_path):
    obj = {"nan": float("nan"), "inf": [float("inf"), -float("inf"), 1.5], 3: (1, 2)}
    assert json_safe(obj) == {"nan": None, "inf": [None, None, 1.5], "3": [1, 2]}
    path = write_json(tmp_path / "x.json", obj)
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    assert json.loads(path.read_text())["inf"] == [None, None, 1.5]


def test_stale_temporaries_of_interrupted_writes_are_removed(tmp_path):
    import os
    import subprocess
    import sys

    from recurlen.util import atomic_files as files

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a process id that no longer runs
    host = files.host_name()
    leftover = tmp_path / f".last.ckpt.{host}.{dead}.0123abcd.tmp"
    running = tmp_path / f".last.ckpt.{host}.{os.getpid()}.0123abcd.tmp"  # a write in progress (this process)
    foreign_young = tmp_path / f".last.ckpt.other-node.{dead}.0123abcd.tmp"
    foreign_old = tmp_path / f".step=10.ckpt.other-node.{dead}.89abcdef.tmp"
    not_ours = tmp_path / ".notes.tmp"
    for f in (leftover, running, foreign_young, foreign_old, not_ours):
        f.write_bytes(b"x")
    old = foreign_old.stat().st_mtime - files.FOREIGN_STALE_AFTER_S - 1
    os.utime(foreign_old, (old, old))
    assert files.remove_stale_temporaries(tmp_path) == sorted([leftover, foreign_old])
    assert running.exists() and foreign_young.exists() and not_ours.exists()
    # atomic_write's own temporaries have the form it recognises
    seen = []
    files.atomic_write(tmp_path / "a.txt", lambda tmp: (seen.append(tmp.name), tmp.write_text("a")))
    assert seen[0].startswith(f".a.txt.{host}.{os.getpid()}.") and seen[0].endswith(".tmp")
