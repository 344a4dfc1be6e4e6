"""backend="kernel" == backend="torch", with mamba-ssm's real Triton kernels executed on CPU (make test-kernels).

The kernel backend here is recurlen's own code, the functions a GPU run calls (recurlen/models/mamba2/kernels.py and the
mixer's kernel branch), calling mamba-ssm's `mamba_chunk_scan_combined` and `rmsnorm_fn` under Triton's
interpreter (the `triton_interpreter` fixture in conftest.py). The conv takes the PyTorch path, as on a GPU
without causal-conv1d; tests/models/mamba2/test_kernel_glue.py checks causal-conv1d's calling convention.

Shapes are tiny (the interpreter runs every kernel program in numpy): d_model 32, 4 heads of 16, d_state 16,
chunks of 16, lengths that are not a multiple of the chunk.
"""

import lightning as L
import pytest
import torch

from recurlen import Mamba2LM, RecurrentState
from recurlen.training.interventions import INTERVENTIONS
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("triton_interpreter")]

LENGTH = 37  # 3 chunks of 16, the last one partial


@pytest.fixture
def make_model(nano_model):
    """`make_model(ngroups=1, n_layer=2)`: the nano Mamba-2 at d_model 32 with chunks of 16."""

    def build(ngroups: int = 1, n_layer: int = 2) -> Mamba2LM:
        model = nano_model("mamba2", d_model=32, n_layer=n_layer, ngroups=ngroups, chunk_size=16)
        with torch.no_grad():  # away from the init's symmetric values, so a swapped or dropped term shows
            for block in model.backbone.layers:
                mixer = block.mixer
                mixer.A_log.uniform_(-3.0, 1.0)
                mixer.D.uniform_(0.5, 1.5)
                mixer.norm.weight.uniform_(0.5, 1.5)
                mixer.conv1d.bias.normal_(0.0, 0.2)
        return model

    return build


def noise_state(model: Mamba2LM, batch: int, *, conv: bool = True, seed: int = 1) -> RecurrentState:
    g = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    ssm = torch.randn(zero.ssm.shape, generator=g)
    return RecurrentState(ssm, torch.randn(zero.conv.shape, generator=g) * 0.5 if conv else zero.conv)


def forward_backward(model: Mamba2LM, ids: torch.Tensor, init: RecurrentState, backend: str):
    """Logits, final state and the gradient of every parameter and of the initial state."""
    model.zero_grad(set_to_none=True)
    init = RecurrentState(init.ssm.clone().requires_grad_(), init.conv.clone().requires_grad_())
    logits, final = model(ids, init, backend=backend)
    # The final states enter the loss too, so their backward (dfinal_states in the kernel) is checked.
    loss = token_loss(logits[:, :-1], ids[:, 1:], None) + final.ssm.pow(2).mean() + final.conv.pow(2).mean()
    loss.backward()
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    grads["initial_state.ssm"], grads["initial_state.conv"] = init.ssm.grad, init.conv.grad
    return logits.detach(), final.detach(), grads


@pytest.mark.parametrize("ngroups", [1, 2])
def test_logits_states_and_every_gradient_match(make_model, close_scaled, ngroups):
    model = make_model(ngroups)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    init = noise_state(model, 2)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, "torch")
    logits, final, grads = forward_backward(model, ids, init, "kernel")
    close_scaled(logits, ref_logits, 1e-5, "logits")
    assert final.ssm.dtype == torch.float32 and final.conv.dtype == torch.float32
    close_scaled(final.ssm, ref_final.ssm, 1e-5, "final SSM state")
    close_scaled(final.conv, ref_final.conv, 1e-5, "final conv state")
    assert set(grads) == set(ref_grads)
    missing = sorted(name for name, g in grads.items() if g is None)
    assert not missing, f"no gradient for {missing}"
    for name, ref in ref_grads.items():
        close_scaled(grads[name], ref, 1e-5, f"gradient of {name}")


def test_split_with_carried_state_equals_one_call(make_model, split_equals_one_call):
    model = make_model(ngroups=2)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    # cuts inside a chunk, a one-token call, and a remainder that is not a multiple of the chunk
    split_equals_one_call(model, ids, noise_state(model, 2, seed=4), cuts=(20, 21),
                          part_tols={"ssm": 1e-5, "conv": 1e-5}, recurrent="ssm")


def _carried(model: Mamba2LM, ids: torch.Tensor) -> RecurrentState:
    """A real final state: the previous segment of the lane run from zeros (on the torch backend)."""
    with torch.no_grad():
        return model(ids, backend="torch")[1]


@pytest.mark.parametrize("kind", ["zeros", "carried", "carried_ssm_only"])
def test_initial_state_of_each_intervention(make_model, close_scaled, kind):
    """none: zeros; state_passing (paper): the carried SSM state with a zero conv window; tbptt: both.
    (random / fitted noise, a noise SSM state, is the gradient test's initial state.)"""
    model = make_model()
    g = torch.Generator().manual_seed(5)
    prev = torch.randint(0, 257, (2, 45), generator=g)
    ids = torch.randint(0, 257, (2, 29), generator=g)
    init = {"zeros": lambda: model.zero_state(2), "carried": lambda: _carried(model, prev),
            "carried_ssm_only": lambda: _carried(model, prev).recurrent_only()}[kind]()
    assert (kind == "zeros") == (init.ssm.abs().sum() == 0)
    assert (kind == "carried") == bool(init.conv.abs().sum() > 0)
    with torch.no_grad():
        ref_logits, ref_final = model(ids, init, backend="torch")
        logits, final = model(ids, init, backend="kernel")
    close_scaled(logits, ref_logits, 1e-5, f"logits from {kind}")
    close_scaled(final.ssm, ref_final.ssm, 1e-5, f"final SSM state from {kind}")
    close_scaled(final.conv, ref_final.conv, 1e-5, f"final conv state from {kind}")


# ---------------------------------------------------------------------------------------------------------
# Training: the LightningModule through `recurlen finetune`'s entry point, two steps per intervention.

class StepRecorder(L.Callback):
    """The loss of every step and the dtypes of the state the module carries to the next step."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.carried_dtypes: list[tuple[torch.dtype, torch.dtype]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        carried = getattr(pl_module.intervention, "carried", None)  # state passing / TBTT keep it
        if carried is not None:
            self.carried_dtypes.append((carried.ssm.dtype, carried.conv.dtype))


def finetune(run_dir, cache_dir, monkeypatch, *, backend: str, intervention: str, precision: str = "32-true"):
    import recurlen.training.finetune as train
    from recurlen.training.experiments.compose import load_experiment

    cfg, _ = load_experiment([
        "model=nano", "model.arch.d_model=32", "model.arch.n_layer=1", "model.arch.chunk_size=16",
        f"model.backend={backend}", f"intervention={intervention}", "intervention.fit_batches=1",
        f"data.seq_len={LENGTH}", "data.batch_size=2", "data.max_documents=40", "data.val_fraction=0.2",
        f"data.cache_dir={cache_dir}", "data.val_segments=1", "data.val_sequences=0", "trainer.max_steps=2",
        "trainer.limit_val_batches=1",
        "trainer.accelerator=cpu", "trainer.devices=1", f"trainer.precision={precision}", "trainer.progress_bar=false",
        "optim.warmup_steps=1", "optim.lr=1e-3", "diagnostics.positionwise=false", "diagnostics.state_norm=false",
        f"run_dir={run_dir}"])
    recorder = StepRecorder()
    train.run_finetune(cfg, callbacks=[recorder])
    return recorder


@pytest.mark.parametrize("intervention", INTERVENTIONS)
def test_two_training_steps_per_intervention_match(tmp_path, cache_dir, monkeypatch, intervention):
    ref = finetune(tmp_path / "torch", cache_dir, monkeypatch, backend="torch", intervention=intervention)
    got = finetune(tmp_path / "kernel", cache_dir, monkeypatch, backend="kernel", intervention=intervention)
    assert len(ref.losses) == len(got.losses) == 2
    # step 1: the same parameters and initial states; step 2: after one AdamW step on each backend's gradients
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref.losses), rtol=1e-5, atol=0.0)


def test_bf16_mixed_carried_state_stays_float32(tmp_path, cache_dir, monkeypatch):
    """Under bf16 autocast the kernel keeps its chunk-boundary states in C's dtype (bf16); the state carried to
    the next step must still be float32 (it accumulates over arbitrarily many steps), on both backends."""
    runs = {backend: finetune(tmp_path / backend, cache_dir, monkeypatch, backend=backend, intervention="tbptt",
                              precision="bf16-mixed") for backend in ("torch", "kernel")}
    for backend, rec in runs.items():
        assert rec.carried_dtypes == [(torch.float32, torch.float32)] * 2, backend
    torch.testing.assert_close(torch.tensor(runs["kernel"].losses), torch.tensor(runs["torch"].losses),
                               rtol=2e-2, atol=0.0)
