"""GLA backend="kernel" == backend="torch", with flash-linear-attention's real chunked GLA kernel executed on CPU.

The kernel backend here is recurlen's own code, the functions a GPU run calls (recurlen/models/gla/kernels.py and the
attention layer's kernel branch), calling fla's `chunk_gla` under Triton's interpreter (the `fla_interpreter`
fixture in conftest.py). The short convs take the same PyTorch path on both backends.

Shapes are tiny (the interpreter runs every kernel program in numpy): hidden 64, 2 heads with key dim 16 and
value dim 32, lengths that are not a multiple of fla's chunk (64) and, in the split test, cuts inside a chunk.
"""

import lightning as L
import pytest
import torch

from recurlen.models.gla import GLALM, GLAState
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("fla_interpreter")]

LENGTH = 77  # one full chunk of 64 and a partial one


@pytest.fixture
def make_model(nano_model):
    """`make_model(short_conv=..., kv_groups=1)`: the nano GLA with num_kv_heads 2 // kv_groups."""

    def build(*, short_conv: bool, kv_groups: int = 1) -> GLALM:
        model = nano_model("gla", use_short_conv=short_conv, num_kv_heads=2 // kv_groups, chunk_size=16)
        # Slow forget gates, so the initial state still matters at the end, and projections larger than the init
        # (std 0.02), so that a swapped or dropped kernel input moves the logits well beyond the tolerance.
        with torch.no_grad():
            for block in model.model.layers:
                block.attn.gk_proj[1].bias.uniform_(2.0, 6.0)
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(block.attn, name).weight.mul_(4.0)
        return model

    return build


def noise_state(model: GLALM, batch: int, seed: int = 1) -> GLAState:
    g = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    return GLAState(torch.randn(zero.kv.shape, generator=g) * 0.3, torch.randn(zero.conv.shape, generator=g) * 0.5)


def forward_backward(model: GLALM, ids: torch.Tensor, init: GLAState, backend: str):
    """Logits, final state and the gradient of every parameter and of the initial state."""
    model.zero_grad(set_to_none=True)
    init = GLAState(init.kv.clone().requires_grad_(), init.conv.clone().requires_grad_())
    logits, final = model(ids, init, backend=backend)
    # The final state enters the loss too, so the kernel's backward from the final state (dht) is checked.
    loss = token_loss(logits[:, :-1], ids[:, 1:], None) + final.kv.pow(2).mean()
    if final.conv.numel():
        loss = loss + final.conv.pow(2).mean()
    loss.backward()
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    grads["initial_state.kv"] = init.kv.grad
    if init.conv.numel():
        grads["initial_state.conv"] = init.conv.grad
    return logits.detach(), final.detach(), grads


@pytest.mark.parametrize("short_conv,kv_groups", [(False, 1), (True, 2)])
def test_logits_state_and_every_gradient_match(make_model, close_scaled, short_conv, kv_groups):
    model = make_model(short_conv=short_conv, kv_groups=kv_groups)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    init = noise_state(model, 2)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, "torch")
    logits, final, grads = forward_backward(model, ids, init, "kernel")
    close_scaled(logits, ref_logits, 1e-5, "logits")
    assert final.kv.dtype == torch.float32
    close_scaled(final.kv, ref_final.kv, 1e-5, "final kv state")
    close_scaled(final.conv, ref_final.conv, 1e-6, "final conv state")
    assert set(grads) == set(ref_grads)
    missing = sorted(name for name, g in grads.items() if g is None)
    assert not missing, f"no gradient for {missing}"
    assert float(grads["initial_state.kv"].abs().max()) > 0
    for name, ref in ref_grads.items():
        close_scaled(grads[name], ref, 1e-5, f"gradient of {name}")


def test_split_with_carried_state_equals_one_call(make_model, split_equals_one_call):
    model = make_model(short_conv=True)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    # a cut inside the first chunk, a one-token call, and a remainder across fla's chunk boundary
    split_equals_one_call(model, ids, noise_state(model, 2, seed=4), cuts=(20, 21),
                          part_tols={"kv": 1e-5, "conv": 1e-6}, recurrent="kv")


@pytest.mark.parametrize("intervention", ["state_passing", "tbptt"])
def test_two_training_steps_with_the_carried_state_match(tmp_path, cache_dir, intervention):
    """The LightningModule through `recurlen finetune`'s entry point: step 2 starts from the state step 1 carried
    (and, after one AdamW step on each backend's gradients, from different parameters)."""
    import recurlen.training.finetune as train
    from recurlen.training.experiments.compose import load_experiment

    losses = {}
    for backend in ("torch", "kernel"):
        cfg, _ = load_experiment([
            "model=gla-nano", f"model.backend={backend}", f"intervention={intervention}", f"data.seq_len={LENGTH}",
            "data.batch_size=2", "data.max_documents=40", "data.val_fraction=0.2",
            f"data.cache_dir={cache_dir}", "data.val_segments=1", "data.val_sequences=0",
            "trainer.max_steps=2", "trainer.limit_val_batches=1", "trainer.accelerator=cpu", "trainer.devices=1",
            "trainer.precision=32-true", "trainer.progress_bar=false", "optim.warmup_steps=1", "optim.lr=1e-3",
            "diagnostics.positionwise=false", "diagnostics.state_norm=false", f"run_dir={tmp_path / backend}"])
        recorder = LossRecorder()
        train.run_finetune(cfg, callbacks=[recorder])
        losses[backend] = torch.tensor(recorder.losses)
    assert len(losses["kernel"]) == 2
    torch.testing.assert_close(losses["kernel"], losses["torch"], rtol=1e-5, atol=0.0)


class LossRecorder(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
