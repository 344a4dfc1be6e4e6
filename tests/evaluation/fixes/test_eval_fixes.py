"""`recurlen eval fixes=[...]`: every fix evaluated beside the runs, in results.json, the report and the figure."""

from __future__ import annotations

import json

import pytest
import torch

from recurlen.commands.report import write_report
from recurlen.diagnostics.compare import plot_comparison
from recurlen.evaluation.runner import EvalConfig, run_eval
from recurlen.util.errors import UserError

T = 32


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, nano_model) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ckpts")
    for seed, name in ((0, "base"), (1, "sp")):
        nano_model(seed=seed).save_pretrained(str(root / name))
    return {name: str(root / name) for name in ("base", "sp")}


def small_cfg(ckpts, tmp_path, **kw) -> EvalConfig:
    base = dict(checkpoints=[f"base={ckpts['base']}", f"sp={ckpts['sp']}"], output_dir=str(tmp_path / "eval"),
                train_len=T, seq_len=256, num_sequences=2, chunk_len=128, batch_size=2, log_bins=0,
                tasks=["positionwise", "reset"], device="cpu", progress=False,
                fixes=["mambaextend", "a_scale", "forget_more"],
                fix={"mambaextend": {"steps": 2, "sequences": 2, "length": 128},
                     "a_scale": {"steps": 1, "sequences": 1}, "forget_more": {"grid": [1, 4], "sequences": 2}})
    return EvalConfig(**{**base, **kw})


def test_fixes_are_evaluated_beside_the_runs_and_calibrate_on_other_rows(checkpoints, tmp_path, monkeypatch):
    seqs = torch.randint(0, 257, (4, 256), generator=torch.Generator().manual_seed(4))
    seen = []
    from recurlen.evaluation.fixes import base as fix_base

    real = fix_base.calibration_data
    monkeypatch.setattr("recurlen.evaluation.fixes.scales.calibration_data",
                        lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    cfg = small_cfg(checkpoints, tmp_path)
    assert (cfg.scored_rows(), cfg.calibration_rows()) == (2, 2)
    results = run_eval(cfg, seqs)
    labels = [r["label"] for r in results["runs"]]
    assert labels == ["base", "sp", "base+mambaextend", "base+a_scale", "base+forget_more"]
    me, a_scale, forget = results["runs"][2:]
    assert me["fix"]["calibration"]["data"]["sequences"] == 2 and me["fix"]["calibration"]["data"]["length"] == 128
    assert me["fix"]["calibration"]["forward_passes"] == 1 + 3 * 2 and me["fix"]["calibrated_parameters"] == 2
    assert a_scale["fix"]["values"]["folded_into"] == "A_log" and me["fix"]["values"]["folded_into"] is None
    assert forget["fix"]["calibration"]["grid"] == [1.0, 4.0] and forget["fix"]["base"] == "base"
    assert all(r["fix"]["seconds"] > 0 for r in results["runs"][2:])
    # calibration rows are the ones after the scored ones, never those the evaluation scores
    assert torch.equal(seen[0], seqs[2:4, :128]) and torch.equal(seen[1], seqs[2:3])
    for entry in results["runs"][2:]:  # evaluated like a run: every bin with its reset control
        assert [b["name"] for b in entry["positionwise"]["bins"]] == \
            [b["name"] for b in results["runs"][0]["positionwise"]["bins"]]
        assert all(b["full_minus_reset"] is not None for b in entry["positionwise"]["bins"][1:])
    on_disk = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert on_disk["config"]["fixes"] == ["mambaextend", "a_scale", "forget_more"]

    # the comparison figure draws every fix as a dashed line beside the runs' solid ones
    ax_fmr = plot_comparison(results["runs"]).axes[0]
    styles = {line.get_label().split("  ")[0]: line.get_linestyle() for line in ax_fmr.get_lines()
              if not line.get_label().startswith("_")}
    assert styles == {"base": "-", "sp": "-", "base+mambaextend": "--", "base+a_scale": "--", "base+forget_more": "--"}

    report = write_report([tmp_path / "eval"], out_dir=tmp_path / "report").read_text()
    section = report.split("## Fixes that need no training")[1]
    assert "| base+mambaextend | mambaextend on base |" in section and "| sp | run |" in section
    assert "MambaExtend (Azizi et al., ICLR 2025" in section
    assert "calibrated by spsa (2 steps, 2 x 128 tokens)" in section
    assert "memory cap" in section
    # Each cell with its interval over the 2 scored sequences, each row with its verdict read on them, and a fix's
    # in-context cost against its base with the 8% bar.
    row = next(line for line in section.splitlines() if line.startswith("| base+mambaextend |"))
    assert row.count(" [") >= 3 and "; [0,T) " in row and ("within 8%" in row or "8%" in row)
    # (an untrained nano model: its loss past T is no better than the unigram's)
    assert "| does not use context; [0,T) " in row


def test_one_fix_twice_under_two_keys_with_their_own_settings(checkpoints, tmp_path):
    seqs = torch.randint(0, 257, (3, 256), generator=torch.Generator().manual_seed(5))
    cfg = small_cfg(checkpoints, tmp_path, checkpoints=[f"base={checkpoints['base']}"], fix_base="base",
                    fixes=["forget_more", "cap2=forget_more"],
                    fix={"forget_more": {"grid": [1, 4], "sequences": 1}, "cap2": {"memory": 2.0}})
    runs = run_eval(cfg, seqs)["runs"]
    assert [r["label"] for r in runs] == ["base", "base+forget_more", "base+cap2"]
    assert runs[2]["fix"]["key"] == "cap2" and runs[2]["fix"]["name"] == "forget_more"
    assert runs[2]["fix"]["values"]["memory_T"] == 2.0 and runs[2]["fix"]["calibration"] is None
    assert runs[1]["fix"]["calibration"]["grid"] == [1.0, 4.0]


def test_fix_settings_are_checked_before_anything_loads(checkpoints, tmp_path):
    with pytest.raises(UserError, match="unknown fix 'mambaextnd'"):
        small_cfg(checkpoints, tmp_path, fixes=["mambaextnd"], fix={})
    with pytest.raises(UserError, match="fix a_scale: .*stepz"):
        small_cfg(checkpoints, tmp_path, fixes=["a_scale"], fix={"a_scale": {"stepz": 1}})
    with pytest.raises(ValueError, match=r"settings for fixes \['forget_more'\] that are not in fixes"):
        small_cfg(checkpoints, tmp_path, fixes=["a_scale"], fix={"forget_more": {}})
    with pytest.raises(ValueError, match="fixes repeat a key"):
        small_cfg(checkpoints, tmp_path, fixes=["a_scale", "a_scale=mambaextend"], fix={})
    with pytest.raises(ValueError, match="fix_base='nope' is not a checkpoint's label"):
        small_cfg(checkpoints, tmp_path, fix_base="nope")


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("fix", ["mambaextend", "a_scale"])
def test_a_fix_that_changes_nothing_scores_exactly_like_its_base(checkpoints, tmp_path, padded, fix):
    """0 calibration steps leave the scales at 1: the fix's row is its base's to the last bit, with the official
    padded head (padded_vocab=true) as without it; a fix scored over fewer rows than its base would gain
    log(1 + padded mass) per token."""
    seqs = torch.randint(0, 257, (4, 256), generator=torch.Generator().manual_seed(5))
    cfg = small_cfg(checkpoints, tmp_path / f"{fix}-{padded}", checkpoints=[f"base={checkpoints['base']}"],
                    padded_vocab=padded, fixes=[fix], fix={fix: {"steps": 0, "sequences": 1}})
    base, fixed = run_eval(cfg, seqs)["runs"]
    assert fixed["label"] == f"base+{fix}"
    for key in ("bins", "per_sequence"):
        assert fixed["positionwise"][key] == base["positionwise"][key]
