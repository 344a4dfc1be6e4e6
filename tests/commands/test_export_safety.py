"""`recurlen export --out DIR` never loses a user's file: a non-empty DIR that is not an earlier export of the same
run is refused unless overwrite=true, no file the export did not write is deleted, the export lands whole or not at
all, and every file it writes gets the same permissions."""

import json
import os
import shutil
import subprocess

import pytest

from recurlen.commands.export import ExportSettings, export
from recurlen.util.atomic_files import host_name
from tests.commands.export_helpers import run, state_passing_run

pytestmark = pytest.mark.usefixtures("cli_logs")  # each test's log lines land in its own capture


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, experiment):
    """A tiny Mamba-2 post-training run (state passing, 2 steps)."""
    return state_passing_run(tmp_path_factory, experiment)


def snapshot(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_a_non_empty_out_that_is_no_export_is_refused_in_one_line_and_left_alone(capsys, tmp_path, run_dir):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    (out / "config.json").write_text('{"mine": true}\n')
    before = snapshot(out)
    for extra in ([], ["--dry-run"]):  # the plan says the same
        rc, stdout, err = run(capsys, "export", run_dir, "--out", out, "format=transformers", *extra)
        assert rc == 2 and stdout == "" and err.count("\n") == 1, err
        assert f"--out {out} is not empty" in err and "(it holds README.md, config.json)" in err
        assert "set overwrite=true" in err
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left beside it


def test_an_export_of_another_run_is_refused(capsys, tmp_path, run_dir):
    other = tmp_path / "other_run"
    shutil.copytree(run_dir, other)  # another run directory (the same weights, another run)
    assert run(capsys, "export", run_dir, "--out", tmp_path / "out", "card=false")[0] == 0
    before = snapshot(tmp_path / "out")
    rc, _, err = run(capsys, "export", other, "--out", tmp_path / "out", "card=false")
    assert rc == 2 and err.count("\n") == 1 and f"an export of another run, {run_dir.name}" in err, err
    assert snapshot(tmp_path / "out") == before


def test_overwrite_replaces_the_export_s_files_and_keeps_the_others(capsys, caplog, tmp_path, run_dir):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    (out / "config.json").write_text('{"mine": true}\n')
    rc, _, err = run(capsys, "export", run_dir, "--out", out, "format=transformers", "overwrite=true")
    assert rc == 0, err
    assert (out / "notes.txt").read_text() == "keep me\n" and "(kept: notes.txt)" in caplog.text
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Mamba2ForCausalLM"]
    record = json.loads((out / "recurlen_export.json").read_text())
    assert "notes.txt" not in record["files"] and "config.json" in record["files"]


def test_format_transformers_never_deletes_a_pytorch_model_bin_it_did_not_write(capsys, tmp_path, run_dir):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "pytorch_model.bin").write_bytes(b"the user's own weights")
    for extra in ([], ["overwrite=true"]):
        rc, _, err = run(capsys, "export", run_dir, "--out", out, "format=transformers", *extra)
        assert rc == 2 and err.count("\n") == 1 and "pytorch_model.bin" in err, err
        assert (out / "pytorch_model.bin").read_bytes() == b"the user's own weights"
    assert sorted(p.name for p in out.iterdir()) == ["pytorch_model.bin"]


def test_a_re_export_of_the_same_run_replaces_only_its_own_files(capsys, tmp_path, run_dir):
    out = tmp_path / "out"
    assert run(capsys, "export", run_dir, "--out", out, "format=official", "card=false")[0] == 0
    assert (out / "pytorch_model.bin").is_file()  # mamba-ssm's own file
    (out / "notes.txt").write_text("keep me\n")
    last = run_dir / "checkpoints" / "last.ckpt"  # another checkpoint of the same run counts as the same run
    rc, _, err = run(capsys, "export", last, "--out", out, "format=transformers", "card=false")
    assert rc == 0, err
    # the earlier export's weights file is gone (two would leave the choice to the reader); the user's file stays
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "notes.txt", "recurlen_config.json", "recurlen_export.json"]
    assert (out / "notes.txt").read_text() == "keep me\n"


@pytest.mark.parametrize("words", [["format=transformers"], ["format=official", "weights=safetensors"],
                                   ["format=official"]])
def test_every_file_and_the_directory_get_the_umask_s_permissions(capsys, tmp_path, run_dir, words):
    umask = os.umask(0o022)
    try:
        rc, _, err = run(capsys, "export", run_dir, "--out", tmp_path / "out", *words)
    finally:
        os.umask(umask)
    assert rc == 0, err
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "out").iterdir()}
    assert set(modes.values()) == {oct(0o644)}, modes  # safetensors writes its file 0600 by itself
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == oct(0o755)


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_export_leaves_out_as_it_was(tmp_path, run_dir, monkeypatch, existing):
    out = tmp_path / "out"
    if existing:  # an earlier float32 export of the run; the failed one writes bfloat16 weights
        export(str(run_dir), out, ExportSettings(format="transformers"))
    before = snapshot(out) if existing else None

    def fail(*args, **kwargs):
        raise RuntimeError("the card failed")

    monkeypatch.setattr("recurlen.commands.export.write_card", fail)
    with pytest.raises(RuntimeError, match="the card failed"):
        export(str(run_dir), out, ExportSettings(format="transformers", dtype="bfloat16"))
    assert (snapshot(out) if existing else out.exists()) == (before if existing else False)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])  # no temporary left


def test_a_killed_export_s_temporary_is_removed_by_the_next_export(capsys, tmp_path, run_dir):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id that no longer runs
    dead = tmp_path / f".out.export.{host_name()}.{gone.pid}.0123abcd.tmp"
    alive = tmp_path / f".out.export.{host_name()}.{os.getpid()}.4567cdef.tmp"  # an export still writing
    for tmp in (dead, alive):
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"half a model")
    assert run(capsys, "export", run_dir, "--out", tmp_path / "out", "card=false")[0] == 0
    assert not dead.exists() and alive.is_dir()


def test_an_out_that_cannot_be_written_is_one_line(capsys, tmp_path, run_dir):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        (read_only / "probe").mkdir()  # root writes through the mode: a path under a file is what it cannot write
    except PermissionError:
        out, why = read_only / "out", "permission denied; choose a writable --out"
    else:
        (read_only / "probe").rmdir()
        blocker = tmp_path / "a-file"
        blocker.write_text("x")
        out, why = blocker / "out", f"{blocker} is a file, not a directory; choose another --out"
    try:
        rc, _, err = run(capsys, "export", run_dir, "--out", out, "card=false")
    finally:
        read_only.chmod(0o755)
    assert rc == 2 and err.strip() == f"recurlen export: error: cannot write {out}: {why}", err
    assert not out.exists() and not list(read_only.iterdir())


def test_a_full_disk_during_the_export_gives_the_export_s_advice(capsys, tmp_path, run_dir, monkeypatch):
    monkeypatch.setenv("RECURLEN_FAULT", "point=start,file=pytorch_model.bin,action=enospc")
    rc, _, err = run(capsys, "export", run_dir, "--out", tmp_path / "out", "card=false")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "no space left on device while writing " in err and err.strip().endswith(
        "(the export stopped and removed what it had written: --out is as it was); free space or choose another "
        "--out, then export again"), err
    assert "run_dir" not in err and "checkpoint" not in err  # a run's advice: there is no run to resume here
    assert list(tmp_path.iterdir()) == []  # no --out, no temporary
