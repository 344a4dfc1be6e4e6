"""The diagnostic callbacks inside a real Lightning fit, read back from TensorBoard event files; for every
architecture (the `arch` fixture)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from recurlen.callbacks import EffectiveRemembrance, PositionwisePerplexity, StateNormMonitor
from recurlen.callbacks.diagnostic import held_out_sequences
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from recurlen.diagnostics.effrem import effective_remembrance
from recurlen.diagnostics.positionwise import evaluate_positionwise
from recurlen.util.tensorboard import fraction_tag, sortable_bin

T = 32
LONG = 160


class TinyLM(pl.LightningModule):
    def __init__(self, model: torch.nn.Module, *, lr: float = 3e-3) -> None:
        super().__init__()
        self.model = model
        self.train_seq_len = T
        self.lr = lr

    def _loss(self, batch_BL: torch.Tensor) -> torch.Tensor:
        logits, _ = self.model(batch_BL[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch_BL[:, 1:].flatten())

    def training_step(self, batch_BL: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch_BL)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch_BL: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch_BL))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class TinyData(pl.LightningDataModule):
    """Byte tokens of a repetitive text; the long held-out sequences are a separate stretch of it."""

    def __init__(self, *, num_long: int = 3) -> None:
        super().__init__()
        text = " ".join(f"the {w} number {i} is {i * 7 % 13}." for i, w in enumerate(["cat", "dog", "owl"] * 200))
        self.tokens = torch.tensor(list(text.encode()), dtype=torch.long)
        self.num_long = num_long

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.tokens[: 16 * (T + 1)].view(16, T + 1), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.tokens[16 * (T + 1): 20 * (T + 1)].view(4, T + 1), batch_size=4)

    def long_validation_sequences(self) -> torch.Tensor:
        start = 1000
        return self.tokens[start: start + self.num_long * LONG].view(self.num_long, LONG)


def make_callbacks(layers=None, **common):
    return [
        PositionwisePerplexity(chunk_len=50, log_bins=5, **common),
        StateNormMonitor(chunk_len=50, state_points=6, layers=layers, **common),
        EffectiveRemembrance(num_points=5, chunk_len=64, **common),
    ]


def read_events(logdir) -> EventAccumulator:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def fit(tmp_path, callbacks, module, *, epochs=2, **trainer_kw):
    logger = TensorBoardLogger(str(tmp_path), name="tb", version=0)
    trainer = pl.Trainer(max_epochs=epochs, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1,
                         logger=logger, callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, **trainer_kw)
    trainer.fit(module, datamodule=TinyData())
    return trainer, module, read_events(logger.log_dir)


def test_callbacks_log_scalars_figures_and_layout(tmp_path, arch, nano_model):
    cbs = make_callbacks()
    trainer, module, acc = fit(tmp_path, cbs, TinyLM(nano_model(arch)))
    tags = acc.Tags()
    scalars = set(tags["scalars"])
    bins = ["[0,1T)", "[1T,2T)", "[2T,4T)", "[4T,8T)"]  # L = 5T: one digit sorts them
    want = {f"val/{k}@{b}" for k in ("loss", "ppl") for b in bins}
    want |= {f"val/full_minus_reset@{b}" for b in bins[1:]}  # [0,T): 0 by construction, not logged
    want |= {f"val/state_{s}/mean@{at}" for s in ("norm", "std") for at in ("1T", "2T", "4T")}
    want |= {f"val/effrem@t={t}T" for t in ("0.250", "0.500", "0.742", "0.992")}  # t = 0: 0 by definition
    assert want <= scalars, sorted(want - scalars)
    assert not any(t.startswith(("val/state_norm/layer", "val/full_minus_reset@[0,")) for t in scalars)
    assert "val/effrem@t=0.000T" not in scalars and not any(t.endswith("@8T") for t in scalars)  # 8T > L
    assert set(tags["images"]) >= {"val/figures/ppl_by_position", "val/figures/full_minus_reset",
                                   "val/figures/state", "val/figures/effrem"}
    assert "custom_scalars__config__" in tags["tensors"]

    # Skipped in the sanity check: one run per real validation epoch, logged at that epoch's step.
    # (Lightning logs validation-epoch scalars at the step of the last training batch: 1 and 3.)
    steps = [e.step for e in acc.Scalars("val/ppl@[1T,2T)")]
    assert steps == [1, 3]
    assert [e.step for e in acc.Images("val/figures/effrem")] == [1, 3]
    assert all(cb.num_runs == 2 and cb.val_epochs == 2 for cb in cbs)

    # The logged numbers are the evaluation's numbers (the trained model, all held-out sequences).
    ref = evaluate_positionwise(module.model, TinyData().long_validation_sequences(), train_len=T, chunk_len=50,
                                state_stats=False).summary(num_log_bins=0)["bins"]
    logged = {row["name"]: row for row in cbs[0].last_results["positionwise"]["bins"]}
    for row in ref:
        assert logged[row["name"]]["loss"] == pytest.approx(row["loss"], rel=1e-5)
        assert logged[row["name"]]["full_minus_reset"] == pytest.approx(row["full_minus_reset"], abs=1e-5)
        assert acc.Scalars(f"val/loss@{sortable_bin(row['name'], 1)}")[-1].value == pytest.approx(row["loss"], rel=1e-5)
    assert logged["[0,T)"]["full_minus_reset"] == 0.0
    assert math.exp(logged["[T,2T)"]["loss"]) == pytest.approx(logged["[T,2T)"]["ppl"])
    effrem = dict(zip(*(cbs[2].last_results["effrem"][k] for k in ("t", "effrem"))))
    assert effrem[0] == 0.0 and all(0.0 <= v <= 1.0 for v in effrem.values()) and effrem[127] > 0.0
    assert acc.Scalars("val/effrem@t=0.992T")[-1].value == pytest.approx(effrem[127], rel=1e-5)
    state = cbs[1].last_results["state"]
    assert state["num_sequences"] == 3 and state["positions"][-1] == LONG

    # One merged custom-scalars layout holds the charts of all three callbacks (TensorBoard reads the last).
    from tensorboard.plugins.custom_scalar import layout_pb2

    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {c.title: [ch.title for ch in c.chart] for c in layout.category}
    assert set(charts) == {"recurlen: perplexity by position bin",
                           "recurlen: full - reset by position bin (> 0: longer context hurts)",
                           "recurlen: recurrent state", "recurlen: effective remembrance"}
    assert charts["recurlen: perplexity by position bin"] == [f"ppl {b}" for b in bins]  # one chart per bin


def test_every_n_val_epochs_and_errors(tmp_path, arch, nano_model):
    cb = PositionwisePerplexity(chunk_len=64, bins="log", log_bins=3, reset_control=False, every_n_val_epochs=2,
                                log_figures=False)
    _, _, acc = fit(tmp_path, [cb], TinyLM(nano_model(arch), lr=0.0), epochs=3)
    assert (cb.val_epochs, cb.num_runs) == (3, 1)
    assert cb.state_dict() == {"val_epochs": 3, "num_runs": 1}
    log_tags = {t for t in acc.Tags()["scalars"] if t.startswith("val/ppl@")}
    rows = cb.last_results["positionwise"]["log_bins"]
    assert log_tags == {f"val/ppl@{sortable_bin(row['name'], 3)}" for row in rows}
    assert log_tags == {"val/ppl@[000,001)", "val/ppl@[001,013)", "val/ppl@[013,159)"}  # tokens, up to L - 1
    assert not any(t.startswith("val/full_minus_reset@") for t in acc.Tags()["scalars"])

    with pytest.raises(ValueError, match=r"EffRem t=128 \(= T\) leaves an empty context"):
        EffectiveRemembrance(context_len=4 * T, t_grid=[0, 4 * T])
    with pytest.raises(ValueError, match=r"bins='tokens' is unknown; allowed: \['multiples', 'log'\]"):
        PositionwisePerplexity(bins="tokens")
    with pytest.raises(ValueError, match=r"every_n_val_epochs must be a positive integer; got 0"):
        StateNormMonitor(every_n_val_epochs=0)
    short = PositionwisePerplexity(seq_len=T, log_figures=False)
    with pytest.raises(ValueError, match=r"seq_len=32 must be larger than the training context train_len=32"):
        fit(tmp_path / "short", [short], TinyLM(nano_model(arch)), epochs=1)
    too_many = EffectiveRemembrance(num_sequences=5, log_figures=False)
    with pytest.raises(ValueError, match=r"EffectiveRemembrance: need 5 held-out sequence\(s\) of at least 128 "
                                         r"tokens; found 3 of 3"):
        fit(tmp_path / "many", [too_many], TinyLM(nano_model(arch)), epochs=1)


@pytest.mark.slow  # two spawned processes: ~10 s on an idle 2-core machine
def test_two_ranks_share_sequences_and_sync(tmp_path, nano_model):
    """2 CPU processes (gloo), 3 held-out sequences: rank 0 scores two, rank 1 one; the logged
    numbers must equal a single-process evaluation of all three (lr=0 keeps the weights fixed)."""
    logger = TensorBoardLogger(str(tmp_path), name="tb", version=0)
    cbs = make_callbacks(layers=[1], log_figures=False)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0,
                         logger=logger, callbacks=cbs, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=2, strategy="ddp_spawn")
    trainer.fit(TinyLM(nano_model(), lr=0.0), datamodule=TinyData())
    acc = read_events(logger.log_dir)
    model = nano_model()
    seqs = TinyData().long_validation_sequences()
    res = evaluate_positionwise(model, seqs, train_len=T, chunk_len=50, state_points=6)
    for row in res.summary(num_log_bins=0)["bins"]:
        tag = sortable_bin(row["name"], 1)
        assert acc.Scalars(f"val/loss@{tag}")[-1].value == pytest.approx(row["loss"], rel=1e-5)
        if row["start"] >= T:
            assert acc.Scalars(f"val/full_minus_reset@{tag}")[-1].value == pytest.approx(
                row["full_minus_reset"], abs=1e-5)
    norm_KS = res.state.means()["ssm_norm"]
    want = float(norm_KS[1, res.state.positions.index(2 * T)])
    assert acc.Scalars("val/state_norm/layer1@2T")[-1].value == pytest.approx(want, rel=1e-5)
    eff = effective_remembrance(model, seqs, context_len=4 * T, num_points=5)
    for t, value in zip(eff.t[1:], eff.mean().tolist()[1:]):
        logged = acc.Scalars(f"val/effrem@t={fraction_tag(t, 4 * T)}")[-1].value
        assert logged == pytest.approx(value, rel=1e-4, abs=1e-7)


def test_sequences_requested_from_datamodule():
    """A DataModule that takes length= / num= (recurlen's does) is asked for exactly what is needed."""

    class Sized(TinyData):
        def long_validation_sequences(self, *, length: int | None = None, num: int | None = None) -> torch.Tensor:
            self.asked = (length, num)
            return self.tokens[: (num or 2) * (length or 64)].view(num or 2, length or 64)

    dm = Sized()
    trainer = SimpleNamespace(datamodule=dm)
    seqs = held_out_sequences(trainer, None, length=200, num=5, what="x")
    assert dm.asked == (200, 5) and seqs.shape == (5, 200)
    assert torch.equal(seqs[1], dm.tokens[200:400])
    assert held_out_sequences(trainer, None, length=None, num=None, what="x").shape == (2, 64)
    plain = SimpleNamespace(datamodule=TinyData())  # no keyword arguments: its sequences are cut to length
    assert held_out_sequences(plain, None, length=100, num=2, what="x").shape == (2, 100)
    with pytest.raises(ValueError, match=r"x: trainer.datamodule \(NoneType\) has no long_validation_sequences\(\)"):
        held_out_sequences(SimpleNamespace(datamodule=None), None, length=10, num=1, what="x")
