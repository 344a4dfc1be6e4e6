"""TensorBoard compares runs: the HParams table, one custom-scalar chart per position bin, tags in position
order, no always-zero tags, the rate each step used. Read back through TensorBoard's own event loader and
through the HTTP data API of a TensorBoard server on 127.0.0.1."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from recurlen.callbacks.hparams import column_order, heading
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from recurlen.training.finetune import run_finetune
from recurlen.training.optim import lr_multiplier
from recurlen.util.tensorboard import HPARAMS_SUFFIX, plain_bin, read_hparams, sortable_bin, write_hparams

T = 16
L = 18 * T  # bins up to [16T,32T): the ones that sorted wrongly before the tags were padded
BINS = ["[00,01T)", "[01T,02T)", "[02T,04T)", "[04T,08T)", "[08T,16T)", "[16T,32T)"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, experiment):
    root = tmp_path_factory.mktemp("tb")
    cfgs = {}
    for name in ("none", "tbptt"):
        cfgs[name] = experiment(
            root / name, f"intervention={name}", "trainer.max_steps=3", "optim.warmup_steps=2",
            f"data.val_length={L}", "trainer.checkpoint_every_n_steps=0", "diagnostics.positionwise=true",
            "diagnostics.state_norm=true", "diagnostics.effrem=true", "diagnostics.effrem_points=3",
            "diagnostics.state_layers=[1]")
        run_finetune(cfgs[name])
    return root, cfgs


def events(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0, "images": 1})
    acc.Reload()
    return acc


def test_tags_sort_in_position_order_without_always_zero_ones(runs):
    root, cfgs = runs
    acc = events(root / "tbptt")
    scalars = acc.Tags()["scalars"]
    ppl = [t for t in scalars if t.startswith("val/ppl@")]
    assert sorted(ppl) == [f"val/ppl@{b}" for b in BINS]
    assert sorted(t for t in scalars if t.startswith("val/full_minus_reset@")) == \
        [f"val/full_minus_reset@{b}" for b in BINS[1:]]  # [0,T): always 0, not logged
    effrem = sorted(t for t in scalars if t.startswith("val/effrem@"))
    assert effrem == ["val/effrem@t=0.500T", "val/effrem@t=0.984T"]  # grid 0, 32, 63 of T = 64; t = 0 is 0
    norm = sorted(t for t in scalars if t.startswith("val/state_norm/"))
    assert norm == [f"val/state_norm/{who}@{k:02d}T" for who in ("layer1", "mean") for k in (1, 2, 4, 8, 16)]
    assert "epoch" not in scalars


def test_train_lr_is_the_rate_each_step_used(runs):
    root, cfgs = runs
    cfg = cfgs["none"]
    logged = [(e.step, e.value) for e in events(root / "none").Scalars("train/lr")]
    want = [(s, cfg.optim.lr * lr_multiplier(s, cfg=cfg.optim, total_steps=cfg.trainer.max_steps)) for s in range(3)]
    assert [s for s, _ in logged] == [s for s, _ in want]
    assert [v for _, v in logged] == pytest.approx([v for _, v in want], rel=1e-6)


def test_hparams_row_and_one_chart_per_bin(runs):
    root, cfgs = runs
    acc = events(root / "tbptt")
    data = {tag: plugin_data_pb2.HParamsPluginData.FromString(content)
            for tag, content in acc.PluginTagToContent("hparams").items()}
    start = data["_hparams_/session_start_info"].session_start_info
    # Five settings columns (TensorBoard shows up to five, 10em each, before any metric): the full - reset
    # columns below start within 1600 px. The run's name (TensorBoard's run column cuts a long path), T, and the
    # data with the held-out sequences the metric columns were measured on each have a column.
    columns = [h.name for h in data["_hparams_/experiment"].experiment.hparam_infos]
    assert columns == ["run", "intervention", "T", "data", "setup"]
    assert start.hparams["run"].string_value == f"tbptt ({root.name})"
    assert start.hparams["intervention"].string_value == "tbptt"
    assert start.hparams["T"].number_value == T
    assert start.hparams["data"].string_value == f"val 2x{L} first, embedded"
    assert start.hparams["setup"].string_value == f"3 steps, lr 0.001, nano, {cfgs['tbptt'].name}"
    infos = data["_hparams_/experiment"].experiment.metric_infos
    metrics = [m.name.tag for m in infos]
    # The columns that say whether the run length-generalizes lead (visible at 1600 px next to the settings).
    assert metrics[:4] == ["val/full_minus_reset@[04T,08T)", "val/full_minus_reset@[08T,16T)",
                           "val/full_minus_reset@[16T,32T)", "val/loss@[00,01T)"]
    # 'val': the training-time validation's numbers, not those of `recurlen eval` or a report.
    assert [m.display_name for m in infos[:4]] == ["val full - reset [4T,8T)", "val full - reset [8T,16T)",
                                                   "val full - reset [16T,32T)", "val loss [0,T)"]
    assert set(metrics) >= {f"val/full_minus_reset@{b}" for b in BINS[1:]} | {"val/effrem@t=0.500T", "val/loss"}
    assert len(list((root / "tbptt" / "tb").glob(f"*{HPARAMS_SUFFIX}"))) == 1

    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {c.title: [ch.title for ch in c.chart] for c in layout.category}
    assert charts["recurlen: perplexity by position bin"] == [f"ppl {b}" for b in BINS]
    assert charts["recurlen: full - reset by position bin (> 0: longer context hurts)"] == \
        [f"full - reset {b}" for b in BINS[1:]]
    for category in layout.category:
        for chart in category.chart:
            regexes = list(chart.multiline.tag)
            assert all(any(re.match(r, t) for t in acc.Tags()["scalars"]) for r in regexes), chart.title


def test_column_order_and_headings():
    tags = ["val/loss@[00,01T)", *[f"val/full_minus_reset@{b}" for b in BINS[1:]], "val/effrem@t=0.500T", "val/loss"]
    assert column_order(tags) == ["val/full_minus_reset@[04T,08T)", "val/full_minus_reset@[08T,16T)",
                                  "val/full_minus_reset@[16T,32T)", "val/loss@[00,01T)",
                                  "val/full_minus_reset@[01T,02T)", "val/full_minus_reset@[02T,04T)",
                                  "val/effrem@t=0.500T", "val/loss"]
    assert heading("val/full_minus_reset@[01T,02T)") == "val full - reset [T,2T)"
    assert heading("val/effrem@t=0.500T") == "val/effrem@t=0.500T"
    # Bins in tokens (bins="log") are no multiples of T: the order is left as it is.
    assert column_order(["val/loss@[0000,0032)", "val/full_minus_reset@[0512,1024)"]) == \
        ["val/loss@[0000,0032)", "val/full_minus_reset@[0512,1024)"]
    for name in ("[0,T)", "[T,2T)", "[2T,4T)", "[16T,32T)", "[128T,256T)"):
        assert plain_bin(sortable_bin(name, 3)) == name


def test_a_resume_rewrites_the_row_with_the_settings_it_runs_with(tmp_path, experiment):
    args = ("intervention=tbptt", "optim.warmup_steps=2", f"data.val_length={L}", "diagnostics.positionwise=true")
    log_dir = tmp_path / "run" / "tb"

    def row_in_tensorboard() -> dict:
        # TensorBoard's own reader keeps the first hparams summary of a run: what the HParams tab shows.
        content = events(tmp_path / "run").PluginTagToContent("hparams")["_hparams_/session_start_info"]
        start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
        return ", ".join(start.hparams["setup"].string_value.split(", ")[:2])

    run_finetune(experiment(tmp_path / "run", *args, "trainer.max_steps=3"))
    assert row_in_tensorboard() == "3 steps, lr 0.001"
    columns = read_hparams(log_dir)[1]
    # Resumed for one more step, validating every 3 (so not before it ends): the row is rewritten at the start,
    # with the columns it had.
    run_finetune(experiment(tmp_path / "run", *args, "trainer.max_steps=4", "optim.lr=5e-4",
                            "trainer.val_every_n_steps=3"))
    assert row_in_tensorboard() == "4 steps, lr 0.0005"
    hparams, again = read_hparams(log_dir)
    assert hparams["setup"].startswith("4 steps, lr 0.0005, ") and hparams["T"] == T and again == columns
    assert len(list(log_dir.glob(f"*{HPARAMS_SUFFIX}"))) == 1


def test_write_hparams_replaces_its_own_file_only(tmp_path):
    (tmp_path / "events.out.tfevents.1.host.1.0").write_bytes(b"")  # the run's main event file: kept
    first = write_hparams(tmp_path, {"max_steps": 3}, ["a"])
    second = write_hparams(tmp_path, {"max_steps": 5}, {"a": "column a", "b": "b"})
    assert not first.exists() and second.exists() and (tmp_path / "events.out.tfevents.1.host.1.0").exists()
    assert read_hparams(tmp_path) == ({"max_steps": 5.0}, {"a": "column a", "b": "b"})
    assert read_hparams(tmp_path / "elsewhere") is None


def test_tensorboard_server_serves_the_runs_and_the_hparams_table(runs):
    root, _ = runs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("tensorboard")
    proc = subprocess.Popen([str(exe), "--logdir", str(root), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"

    def get(path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read().decode())

    try:
        deadline = time.time() + 120
        while True:
            try:
                tags = get("/data/plugin/scalars/tags")
                if {"none/tb", "tbptt/tb"} <= set(tags):
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.time() < deadline, "tensorboard did not serve both runs within 120 s"
            time.sleep(1)
        assert "val/full_minus_reset@[16T,32T)" in tags["tbptt/tb"]
        experiment = get("/data/plugin/hparams/experiment", {"experimentName": ""})
        # TensorBoard's server orders the settings columns itself (by name).
        assert sorted(h["name"] for h in experiment["hparamInfos"]) == ["T", "data", "intervention", "run", "setup"]
        assert [m["displayName"] for m in experiment["metricInfos"][:4]] == [
            "val full - reset [4T,8T)", "val full - reset [8T,16T)", "val full - reset [16T,32T)", "val loss [0,T)"]
        groups = get("/data/plugin/hparams/session_groups", {
            "experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                                                      "STATUS_RUNNING"],
            "colParams": [], "startIndex": 0, "sliceSize": 100})
        rows = {g["hparams"]["intervention"]: g for g in groups["sessionGroups"]}
        assert set(rows) == {"none", "tbptt"}
        values = {m["name"]["tag"]: m["value"] for m in rows["tbptt"]["metricValues"]}
        logged = events(root / "tbptt").Scalars("val/full_minus_reset@[08T,16T)")[-1].value
        assert values["val/full_minus_reset@[08T,16T)"] == pytest.approx(logged, rel=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
