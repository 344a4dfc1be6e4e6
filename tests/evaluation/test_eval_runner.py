"""`run_eval`: results.json + PNGs from saved checkpoints, several runs compared, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from recurlen import Mamba2LM
from recurlen.diagnostics.plots import figures_for, load_runs
from recurlen.evaluation.runner import EvalConfig, run_eval

T = 32


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, nano_model) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for seed, name in ((0, "base"), (1, "sp")):
        nano_model(seed=seed).save_pretrained(str(root / name))
        out[name] = str(root / name)
    return out


@pytest.fixture(scope="module")
def seqs() -> torch.Tensor:
    return torch.randint(0, 257, (4, 300), generator=torch.Generator().manual_seed(4))


def small_cfg(ckpts, tmp_path, **kw) -> EvalConfig:
    base = dict(checkpoints=[f"baseline={ckpts['base']}", ckpts["sp"]], output_dir=str(tmp_path / "eval"),
                train_len=T, seq_len=256, num_sequences=3, chunk_len=100, batch_size=2, state_points=8,
                log_bins=6, effrem_points=5, effrem_sequences=2, device="cpu", progress=False)
    return EvalConfig(**{**base, **kw})


def test_run_eval_writes_results_and_plots(checkpoints, seqs, tmp_path):
    cfg = small_cfg(checkpoints, tmp_path)
    results = run_eval(cfg, seqs)
    out = tmp_path / "eval"
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk == results
    assert on_disk["format"] == "recurlen.eval/1" and on_disk["config"]["seq_len"] == 256
    assert [r["label"] for r in on_disk["runs"]] == ["baseline", "sp"]
    run = on_disk["runs"][0]
    assert run["train_len"] == T and run["seq_len"] == 256
    bins = run["positionwise"]["bins"]
    assert [b["name"] for b in bins] == ["[0,T)", "[T,2T)", "[2T,4T)", "[4T,8T)"]
    assert bins[0]["full_minus_reset"] == 0.0 and bins[0]["count"] == 3 * T
    assert 4.0 < bins[1]["loss"] < 7.0 and bins[1]["ppl"] == pytest.approx(2.718281828 ** bins[1]["loss"])
    assert run["state"]["positions"][-1] == 256 and len(run["state"]["ssm_norm"]) == 2
    eff = run["effrem"]
    assert eff["T"] == 4 * T and eff["t"][0] == 0 and eff["t"][-1] == 4 * T - 1 and eff["num_sequences"] == 2
    assert eff["effrem"][0] == 0.0 and all(0.0 <= v <= 1.0 for v in eff["effrem"])
    assert bins[1]["loss"] != on_disk["runs"][1]["positionwise"]["bins"][1]["loss"]  # two different models
    for name in ("compare_full_minus_reset.png", "ppl_by_position.png", "loss_by_position.png",
                 "full_minus_reset.png", "state_by_position.png", "effrem.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert set(results["plots"]) == {"compare", "ppl", "loss", "full_minus_reset", "state", "effrem"}
    assert list((out / "compare").glob("events.out.tfevents.*"))  # the comparison as a TensorBoard run
    assert not list(out.glob("*.tmp"))

    # Plot helpers take runs loaded back from several results files (a report comparing them).
    runs = load_runs([out, out / "results.json"])
    assert len(runs) == 4
    figs = figures_for(runs)
    assert set(figs) == set(results["plots"])
    labels = [line.get_label() for line in figs["ppl"].axes[0].get_lines()]
    assert labels[:4] == ["baseline", "sp", "baseline", "sp"]  # one curve per run, then the T markers
    assert [line.get_label() for line in figs["effrem"].axes[0].get_lines()][:2] == ["baseline (T=128)", "sp (T=128)"]


def test_tasks_subset(checkpoints, seqs, tmp_path):
    cfg = small_cfg(checkpoints, tmp_path, checkpoints=[checkpoints["base"]], tasks=["positionwise"])
    results = run_eval(cfg, seqs)
    run = results["runs"][0]
    assert run["label"] == "base" and set(run) == {"label", "source", "train_len", "seq_len", "architecture", "model",
                                                   "positionwise", "unigram_loss"}
    assert run["architecture"] == "mamba2" and run["model"].startswith("Mamba-2 (d_model 64, 2 layers")
    assert "reset_loss" not in run["positionwise"]["bins"][0]
    assert set(results["plots"]) == {"ppl", "loss"}
    assert set(figures_for([{"label": "x"}])) == set()


def test_bad_config_and_input(checkpoints, seqs, tmp_path):
    with pytest.raises(ValueError, match=r"seq_len=32 must be larger than the training context train_len=32"):
        small_cfg(checkpoints, tmp_path, seq_len=T)
    with pytest.raises(ValueError, match=r"effrem_len=16 must be larger than the training context train_len=32"):
        small_cfg(checkpoints, tmp_path, effrem_len=16)
    with pytest.raises(ValueError, match=r"t-grid values \[200\] lie outside \[0, T\] = \[0, 128\]"):
        small_cfg(checkpoints, tmp_path, effrem_len=128, effrem_t=[0, 200])
    with pytest.raises(ValueError, match=r"unknown tasks \['ppl'\]; allowed"):
        small_cfg(checkpoints, tmp_path, tasks=["ppl"])
    with pytest.raises(ValueError, match=r"labels must be unique; \['a'\] repeat"):
        small_cfg(checkpoints, tmp_path, checkpoints=[f"a={checkpoints['base']}", f"a={checkpoints['sp']}"])
    with pytest.raises(ValueError, match=r"need 3 held-out sequence\(s\) of at least 256 tokens; found 2 of 4 "
                                         r"\(the longest has 300 tokens\)"):
        run_eval(small_cfg(checkpoints, tmp_path), [seqs[0], seqs[1], seqs[2, :100], seqs[3, :200]])
    with pytest.raises(ValueError, match=r"does not record its training context; set train_len= \(EvalConfig"):
        run_eval(small_cfg(checkpoints, tmp_path, train_len=None), seqs)
    fake = tmp_path / "not_recurlen.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2, 2)}}, fake)
    with pytest.raises(ValueError, match=r"state API"):
        run_eval(small_cfg(checkpoints, tmp_path, checkpoints=[str(fake)]), seqs)


def test_padded_vocab_normalises_over_the_padded_head_like_the_official_models(checkpoints, seqs, tmp_path):
    """padded_vocab=true scores over all 264 rows of the nano head (257 real): the NLL grows by exactly the
    log of one plus the padded rows' share of the mass, per token."""
    cfg = dict(checkpoints=[checkpoints["base"]], tasks=["positionwise"], log_bins=0)
    real = run_eval(small_cfg(checkpoints, tmp_path / "real", **cfg), seqs)["runs"][0]["positionwise"]["bins"][0]
    padded = run_eval(small_cfg(checkpoints, tmp_path / "padded", padded_vocab=True, **cfg),
                      seqs)["runs"][0]["positionwise"]["bins"][0]
    assert real["name"] == padded["name"] == "[0,T)"
    model = Mamba2LM.from_pretrained(checkpoints["base"])
    assert model.lm_head.weight.shape[0] == 264 and model.config.vocab_size == 257
    with torch.no_grad():
        hidden, _ = model.forward_hidden(seqs[:3, :T])
        full = torch.nn.functional.linear(hidden, model.lm_head.weight).double()
        gap = (full.logsumexp(-1) - full[..., :257].logsumexp(-1)).mean().item()
    assert gap > 0
    assert padded["loss"] - real["loss"] == pytest.approx(gap, rel=1e-3, abs=1e-6)
