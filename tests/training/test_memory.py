"""The memory estimate: measured on the meta device, close to (and above) what a real step keeps, and a run that
cannot fit stops with one line before anything is written."""

import pytest
import torch

from recurlen.commands import cli
from recurlen.models import registry
from recurlen.training import memory
from recurlen.training.lit_module import chunks_head_loss, head_token_loss, token_loss


def _saved_for_backward(model, ids, *, head_loss: str | None = None) -> int:
    """Bytes autograd really keeps for one forward pass (each buffer once), on the CPU; with head_loss, the loss as
    the training step computes it (lit_module.head_token_loss), else token_loss of the whole logits."""
    params = {id(p) for p in model.parameters()}
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if id(t) not in params and key not in seen:
            seen.add(key)
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if head_loss is None:
            logits, _ = model(ids)
            token_loss(logits, ids, None)
        else:
            hidden, _ = model.forward_hidden(ids)
            head_token_loss(model, hidden, ids, None, mode=head_loss)
    return total


@pytest.mark.parametrize("arch", list(registry.architectures()))
def test_the_meta_device_count_is_close_to_and_above_what_a_real_step_keeps(arch, nano_model):
    model = nano_model(arch)
    lanes, seq_len = 2, 256
    real = _saved_for_backward(model.train(), torch.zeros(lanes, seq_len, dtype=torch.long))
    estimated, per_lane = memory.activation_bytes(arch, model.config, lanes=lanes, seq_len=seq_len)
    assert estimated == per_lane * lanes
    assert real <= estimated <= 1.5 * real, (arch, real, estimated)


@pytest.mark.parametrize("head_loss", ["auto", "chunked"])
def test_the_estimate_counts_what_the_chunked_head_loss_keeps(nano_model, head_loss):
    """Where the step computes its loss in chunks (auto: a 50k vocabulary's logits at 2 x 256 positions exceed one
    chunk), the estimate is close to and above what that step keeps: the hidden states' gradient and the head's float32
    gradient once, not the whole logits the plain loss keeps (which an estimate of the plain loss counts)."""
    model = nano_model("mamba2", vocab_size=50277).train()
    lanes, seq_len = 2, 256
    assert chunks_head_loss(model, lanes * seq_len, "auto")
    real = _saved_for_backward(model, torch.zeros(lanes, seq_len, dtype=torch.long), head_loss=head_loss)
    estimated, per_lane = memory.activation_bytes("mamba2", model.config, lanes=lanes, seq_len=seq_len,
                                                  head_loss=head_loss)
    assert real <= estimated <= 1.5 * real, (real, estimated)
    once = estimated - lanes * per_lane  # the head's gradient, float32, whatever the lanes and the precision
    assert once == model.lm_head.weight.numel() * 4
    plain, _ = memory.activation_bytes("mamba2", model.config, lanes=lanes, seq_len=seq_len, head_loss="plain")
    assert plain > 1.5 * real
    half = memory.estimate(model.config, "mamba2", lanes=lanes, seq_len=seq_len, num_params=1, device="cuda",
                           precision="bf16-mixed", strategy="ddp", world_size=1, kernels=False, head_loss=head_loss)
    assert (half.per_lane, half.activations_fixed) == (per_lane // 2, once)
    assert half.activations == (lanes * per_lane) // 2 + once


def test_activations_scale_linearly_past_the_probe_length(nano_model):
    model = nano_model("mamba2")
    short, _ = memory.activation_bytes("mamba2", model.config, lanes=1, seq_len=memory.PROBE_LEN)
    long, _ = memory.activation_bytes("mamba2", model.config, lanes=3, seq_len=4 * memory.PROBE_LEN)
    assert long == 12 * short


def test_fsdp_shards_the_weights_and_half_precision_halves_the_activations():
    a = registry.get("mamba2")
    config, n = a.preset("nano"), 10_000_000
    plain = memory.estimate(config, "mamba2", lanes=4, seq_len=128, num_params=n, device="cuda", precision="32-true",
                            strategy="ddp", world_size=8, kernels=False)
    sharded = memory.estimate(config, "mamba2", lanes=4, seq_len=128, num_params=n, device="cuda",
                              precision="bf16-mixed", strategy="fsdp", world_size=8, kernels=False)
    assert (plain.weights, plain.optimizer) == (4 * n, 8 * n)
    assert (sharded.weights, sharded.optimizer) == (4 * n // 8, 8 * n // 8)
    assert sharded.activations == plain.activations // 2


def test_a_run_that_cannot_fit_stops_in_one_line_before_writing(tmp_path, cache_dir, capsys, cli_logs):
    run = tmp_path / "run"
    rc = cli.main(["finetune", "model=nano", "data.batch_size=100000", f"data.cache_dir={cache_dir}",
                   "data.max_documents=60", "intervention=none", "data.layout=independent", "data.val_fraction=0.2",
                   "data.val_length=64", "data.val_sequences=2", "trainer.max_steps=2", "trainer.accelerator=cpu",
                   f"run_dir={run}"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("recurlen finetune: error: this run needs about ") and "GiB of CPU memory" in err
    assert "for 100000 lanes of T=" in err and "is available; lower data.batch_size (about " in err
    assert not run.exists()


def test_dry_run_prints_the_estimate(tmp_path, capsys, cli_logs):
    rc = cli.main(["finetune", "model=nano", "data.batch_size=4", f"run_dir={tmp_path / 'run'}", "--dry-run"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("memory"))
    assert rc == 0 and "of CPU memory per rank (activations" in line and "available here: fits" in line
