"""The GPU path in one run (make gpu-check): recurlen's step against mamba-ssm's, correctness, the real commands.

    python benchmarks/gpu_check.py [--out runs/gpu-check/summary.json] [--shapes 130m 780m] [--batch N] [--quick]
    python benchmarks/gpu_check.py --cpu-rehearsal --out runs/gpu-check/rehearsal.json   # the comparison, on a CPU

Needs CUDA and mamba-ssm's Triton kernels (make gpu-check installs them; causal-conv1d is optional). In order, each
part started only while the time budget (--budget-s, default 570 s: the whole check within 10 minutes) has room:
  1. recurlen's whole training step (forward + backward + AdamW, bf16 autocast, kernels on) against mamba-ssm's own
     `MambaLMHeadModel` of the same config holding the same weights, at the 130m shape (8 x 2048 tokens) and the 780m
     shape (4 x 2048): tokens/s, peak memory and MFU side by side, interleaved (benchmarks/gpu_peer.py), with
     recurlen's loss on the whole logits as a third column (what trainer.head_loss=auto's chunked loss saves);
     target: recurlen >= 0.95x mamba-ssm's tokens/s at <= its peak memory;
  2. agreement, kernel path vs torch path, at the tiny and 130m shapes (float32, from a random initial state;
     benchmarks/bench_gpu.py), and one Mamba-2 mixer forward + backward, recurlen vs mamba-ssm's `Mamba2` module
     (target: recurlen's time <= 1.1x);
  3. `make test-gpu`: the kernel backend == the torch backend (forward, backward, initial-state gradients, split
     invariance, bf16), and an FSDP run with the diagnostics;
  4. `recurlen finetune` of a randomly initialised 130m checkpoint in the official format, --steps steps per
     intervention on the kernel path in bf16-mixed (tokens/s, peak GPU memory), TBTT first, then
  5. `recurlen eval` of its TBTT run on one 131072-token sequence in chunks (tokens/s, peak GPU memory);
  6. with 2+ GPUs: the TBTT post-training under FSDP with 2 processes.
The JSON summary (--out) is rewritten after every part and every timed round, so a run cut short keeps what it
measured; parts the budget left no room for are listed as skipped. Exits 1 on any mismatch or failed part, 2 when
there is no CUDA device or the kernels do not import (nothing runs then); unmet speed targets are reported in the
summary, not failed.

--cpu-rehearsal runs part 1's code end to end on a CPU at a small shape (REHEARSAL_SHAPE in gpu_peer.py, 1 x 32
tokens, two chunks of the scan, float32, the chunked loss forced on, no warm-up, at most 2 rounds): mamba-ssm's
model and recurlen's kernel path both execute their real Triton kernels under Triton's interpreter
(TRITON_INTERPRET=1, set by re-executing itself). Its numbers say nothing about a GPU; it shows that the comparison
runs and what its JSON holds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

PEER_SLACK = 1.10  # recurlen mixer time / mamba-ssm Mamba2 time
# TBTT first: the evaluation reads its run
INTERVENTIONS = ("tbptt", "none", "state_passing", "random_noise", "fitted_noise")
BUDGET_S = 570.0  # the whole check within 10 minutes, with room to write the summary


def write_summary(path: Path, summary: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, path)


def run_command(cmd: list[str], *, timeout: int, log_path: Path) -> dict:
    """A subprocess with its output kept in log_path: exit code and seconds."""
    start = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        rc, out = 124, f"timed out after {timeout} s\n{err.stdout or ''}{err.stderr or ''}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(out if isinstance(out, str) else str(out))
    return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(time.perf_counter() - start, 1), "log": str(log_path)}


# --------------------------------------------------------------------------------------------- speed
def bench(fn, *, warmup: int = 2, repeats: int = 10) -> float:
    """Seconds per call (CUDA-synchronised), after warm-up calls (autotuning, allocator)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def mixer_vs_mamba_ssm(batch: int, length: int, repeats: int) -> dict:
    """One Mamba-2 mixer at the 130m shape, forward + backward in bf16 autocast: recurlen vs mamba-ssm."""
    from mamba_ssm.modules.mamba2 import Mamba2

    from recurlen import preset
    from recurlen.models import causal_conv
    from recurlen.models.mamba2.model import Mamba2Mixer

    cfg = preset("130m")
    has_conv = causal_conv._causal_conv1d() is not None
    torch.manual_seed(0)
    ours = Mamba2Mixer(cfg).cuda()
    # use_mem_eff_path (mamba-ssm's default, the fused conv + scan) needs causal-conv1d; without it mamba-ssm
    # runs the same pieces recurlen does (PyTorch conv, Triton scan, Triton gated norm).
    peer = Mamba2(d_model=cfg.d_model, d_state=cfg.d_state, d_conv=cfg.d_conv, expand=cfg.expand,
                  headdim=cfg.headdim, ngroups=cfg.ngroups, chunk_size=cfg.chunk_size,
                  use_mem_eff_path=has_conv, layer_idx=0).cuda()
    u = torch.randn(batch, length, cfg.d_model, device="cuda", requires_grad=True)
    zero_ssm = torch.zeros(batch, cfg.nheads, cfg.headdim, cfg.d_state, device="cuda")
    zero_conv = torch.zeros(batch, cfg.conv_dim, cfg.d_conv - 1, device="cuda")

    def ours_step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, ssm, conv = ours(u, zero_ssm, zero_conv, use_kernels=True)
        (out.float().sum() + ssm.sum()).backward()

    def peer_step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = peer(u)
        out.float().sum().backward()

    ours_s, peer_s = bench(ours_step, repeats=repeats), bench(peer_step, repeats=repeats)
    return {"batch": batch, "length": length, "causal_conv1d": has_conv, "mamba_ssm_fused_path": has_conv,
            "recurlen_ms": round(1e3 * ours_s, 3), "mamba_ssm_ms": round(1e3 * peer_s, 3),
            "ratio_recurlen_over_mamba_ssm": round(ours_s / peer_s, 3),
            "target": f"<= {PEER_SLACK}", "met": ours_s <= PEER_SLACK * peer_s}


# --------------------------------------------------------------------------------------------- fixtures
def write_official_130m(directory: Path) -> Path:
    """A randomly initialised 130m checkpoint in the official layout: config.json + fp16 pytorch_model.bin."""
    from recurlen import Mamba2LM, preset

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Mamba2LM(preset("130m"))
    (directory / "config.json").write_text(json.dumps(model.config.to_official_json(), indent=2))
    torch.save({k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()},
               directory / "pytorch_model.bin")
    return directory


def write_corpus(directory: Path, *, documents: int, words_per_doc: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["state", "length", "token", "model", "recurrent", "memory", "context", "chunk", "lane", "scan",
             "the", "of", "and", "a", "to", "in", "is", "it", "that", "with"]
    for i in range(documents):
        (directory / f"doc{i:04d}.txt").write_text(" ".join(rng.choice(words) for _ in range(words_per_doc)))
    return directory


def finetune_cmd(checkpoint: Path, corpus: Path, run_dir: Path, intervention: str, *, steps: int, batch: int,
                 devices: int = 1, strategy: str | None = None) -> list[str]:
    # `make finetune MODEL=130m INTERVENTION=<i> STEPS=<n> GPUS=<d>` with the local checkpoint and corpus.
    cmd = [sys.executable, "-m", "recurlen", "finetune", "model=130m", f"intervention={intervention}",
           f"trainer.max_steps={steps}", f"model.pretrained={checkpoint}", "model.backend=kernel",
           f"data.source={corpus}", "data.tokenizer=bytes", "data.streaming=false", "data.num_proc=null",
           "data.max_documents=null", "data.seq_len=2048", f"data.batch_size={batch}", "data.val_fraction=0.2",
           "data.val_segments=8", "data.val_sequences=0", f"data.cache_dir={run_dir.parent / 'cache'}",
           "trainer=gpu", f"trainer.devices={devices}", "trainer.precision=bf16-mixed", "trainer.limit_val_batches=1",
           "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "intervention.fit_batches=2",
           "diagnostics.positionwise=false", "diagnostics.state_norm=false", f"run_dir={run_dir}"]
    if strategy:
        cmd.append(f"trainer.strategy={strategy}")
    return cmd


def tb_scalars(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


# --------------------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    from gpu_peer import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu-check/summary.json", help="the JSON summary")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                        help="model shapes of the comparison with mamba-ssm (default: 130m 780m)")
    parser.add_argument("--batch", type=int, default=None,
                        help="lanes of 2048 tokens (default: 8 at 130m, 4 at 780m; the post-training runs 8)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds of the comparison (quick: 3)")
    parser.add_argument("--steps", type=int, default=10, help="post-training steps per intervention")
    parser.add_argument("--eval-len", type=int, default=131072, help="tokens of the chunked evaluation")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="start no part after this many seconds (default 570: the whole check within 10 minutes)")
    parser.add_argument("--skip-test-gpu", action="store_true", help="do not run make test-gpu")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, 2 steps, batch 2, a 16k evaluation (a smoke run)")
    parser.add_argument("--cpu-rehearsal", action="store_true",
                        help="run the comparison with mamba-ssm on this CPU at a small shape under Triton's "
                             "interpreter (no GPU needed): checks the code path and the JSON, not the speed")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.batch, args.eval_len = 3, 2, args.batch or 2, 16384
    return args


class Summary:
    """The JSON summary, rewritten (atomically) whenever a part or a timed round adds to it."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out, self.t0 = out, time.perf_counter()
        self.data: dict = {"format": "recurlen.gpu-check/2",
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                           "args": vars(args), "steps": {}, "targets": {}, "failures": [], "skipped": []}

    def write(self) -> None:
        write_summary(self.out, self.data)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def part(self, name: str, fn, *, budget: float | None = None, needs_s: float = 0.0) -> dict | None:
        """Run one part; record its result, or its failure, and carry on with the next; skip it when the budget
        has less than needs_s seconds left."""
        if budget is not None and self.elapsed() + needs_s > budget:
            self.data["skipped"].append(name)
            self.data["steps"][name] = {"skipped": f"time budget: {self.elapsed():.0f} s of {budget:.0f} s used"}
            self.write()
            print(f"== {name}: skipped (time budget)", flush=True)
            return None
        start = time.perf_counter()
        try:
            result = fn()
        except Exception as err:  # a failed part is a finding: record it and run the others
            result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            self.data["failures"].append(name)
        result["seconds"] = round(time.perf_counter() - start, 1)
        self.data["steps"][name] = result
        self.write()
        print(f"== {name}: {json.dumps({k: v for k, v in result.items() if k != 'traceback'})}", flush=True)
        return result

    def finish(self) -> int:
        self.data["ok"] = not self.data["failures"]
        self.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.data["seconds"] = round(self.elapsed(), 1)
        self.write()
        print(f"gpu-check {'passed' if self.data['ok'] else 'FAILED: ' + '; '.join(self.data['failures'])}; "
              f"summary in {self.out}", flush=True)
        return 0 if self.data["ok"] else 1


def versus_mamba_ssm(summary: Summary, *, shape: str, batch: int, length: int, device: str, rounds: int,
                     warmup: int, head_loss: str = "auto") -> dict:
    """Part 1 for one shape; each timed round's numbers are in the summary as soon as they exist."""
    from gpu_peer import compare_train_step

    name = f"train_step_vs_mamba_ssm_{shape}"

    def report(result: dict) -> None:
        summary.data["steps"][name] = {**result, "partial": True}
        if "recurlen_vs_mamba_ssm" in result:
            summary.data["targets"][name] = result["recurlen_vs_mamba_ssm"]
        summary.write()

    result = compare_train_step(shape=shape, batch=batch, length=length, device=device, rounds=rounds, warmup=warmup,
                                head_loss=head_loss, report=report)
    if not result["same_function"]["ok"]:
        summary.data["failures"].append(f"{name}: logits differ from mamba-ssm's ({result['same_function']})")
    return result


def cpu_rehearsal(args: argparse.Namespace) -> int:
    """Part 1 on this CPU (see the module docstring); re-executes itself under Triton's interpreter first."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    from _triton_cpu import interpreted_kernels

    summary = Summary(Path(args.out), args)
    summary.data.update(device="cpu (rehearsal: Triton's interpreter)", rehearsal=True)
    print("# gpu-check --cpu-rehearsal: the comparison with mamba-ssm's MambaLMHeadModel on a CPU, small shape",
          flush=True)
    with interpreted_kernels():
        summary.part("train_step_vs_mamba_ssm_rehearsal", lambda: versus_mamba_ssm(
            summary, shape="rehearsal", batch=args.batch or 1, length=32, device="cpu", rounds=min(args.rounds, 2),
            warmup=0, head_loss="chunked"))
    return summary.finish()


def main() -> int:
    from gpu_peer import SHAPES

    args = parse_args()
    if args.cpu_rehearsal:
        return cpu_rehearsal(args)
    out = Path(args.out)
    work = out.parent
    summary = Summary(out, args)
    budget = args.budget_s

    if not torch.cuda.is_available():
        summary.data.update(ok=False, error="no CUDA device: this check runs the GPU path (torch.cuda.is_available() "
                                            f"is False; torch {torch.__version__}, built with CUDA "
                                            f"{torch.version.cuda})")
        summary.write()
        print(f"gpu-check: {summary.data['error']}. Run it on a machine with an NVIDIA GPU: make gpu-check "
              "(on a CPU, benchmarks/gpu_check.py --cpu-rehearsal rehearses the comparison with mamba-ssm)",
              file=sys.stderr)
        return 2
    from recurlen.models.mamba2.kernels import _mamba_kernels

    fns, why = _mamba_kernels()
    if fns is None:
        summary.data.update(ok=False, error=f"mamba-ssm's Triton kernels do not import ({why})")
        summary.write()
        print(f"gpu-check: {summary.data['error']}; make gpu-check installs them", file=sys.stderr)
        return 2
    summary.data["device"] = torch.cuda.get_device_name()
    summary.data["gpus"] = torch.cuda.device_count()
    print(f"# gpu-check on {summary.data['device']} x {summary.data['gpus']} | torch {torch.__version__}", flush=True)

    # 1. the whole training step against mamba-ssm's MambaLMHeadModel
    for shape in args.shapes:
        batch = args.batch or SHAPES[shape]
        summary.part(f"train_step_vs_mamba_ssm_{shape}", lambda shape=shape, batch=batch: versus_mamba_ssm(
            summary, shape=shape, batch=batch, length=2048, device="cuda", rounds=args.rounds, warmup=2),
            budget=budget, needs_s=60)
        torch.cuda.empty_cache()
    print("targets: " + json.dumps(summary.data["targets"]), flush=True)

    # 2. agreement kernel vs torch; recurlen's mixer vs mamba-ssm's Mamba2 module
    def agreement_part() -> dict:
        from bench_gpu import AGREE_TOL, agreement

        from recurlen import Mamba2LM, preset

        result: dict = {"tolerance": AGREE_TOL}
        for shape in ("tiny", "130m"):
            torch.manual_seed(0)
            model = Mamba2LM(preset(shape)).cuda()
            ids = torch.randint(0, model.config.vocab_size, (2, 2048), device="cuda")
            agree = agreement(model, ids)
            bad = [k for k, v in agree.items() if not v <= AGREE_TOL]
            result[shape] = {"agreement": agree, "mismatches": bad}
            if bad:
                summary.data["failures"].append(f"agreement {shape}: {bad}")
            del model
            torch.cuda.empty_cache()
        return result
    summary.part("agreement_kernel_vs_torch", agreement_part, budget=budget, needs_s=30)

    def peer() -> dict:
        res = mixer_vs_mamba_ssm(args.batch or 8, 2048, repeats=5 if args.quick else 20)
        summary.data["targets"]["mixer_vs_mamba_ssm_Mamba2"] = {
            k: res[k] for k in ("ratio_recurlen_over_mamba_ssm", "target", "met")}
        return res
    summary.part("mixer_vs_mamba_ssm", peer, budget=budget, needs_s=20)

    # 3. the GPU tests
    if not args.skip_test_gpu:
        def test_gpu() -> dict:
            res = run_command(["make", "--no-print-directory", "test-gpu", f"VENV={sys.prefix}"],
                              timeout=int(min(300, max(30, budget - summary.elapsed()))),
                              log_path=work / "test-gpu.log")
            if res["rc"] != 0:
                raise RuntimeError(f"make test-gpu exited {res['rc']}; see {res['log']}")
            return res
        summary.part("test_gpu", test_gpu, budget=budget, needs_s=90)

    # 4. post-training at the 130m shape, every intervention, on the kernel path in bf16-mixed
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=work if work.exists() else None))
    checkpoint = write_official_130m(tmp / "mamba2-130m")
    corpus = write_corpus(tmp / "corpus", documents=400, words_per_doc=3000)
    for intervention in INTERVENTIONS:
        def finetune(intervention=intervention) -> dict:
            run_dir = tmp / "runs" / intervention
            cmd = finetune_cmd(checkpoint, corpus, run_dir, intervention, steps=args.steps,
                               batch=args.batch or 8)
            res = run_command(cmd, timeout=int(max(30, budget - summary.elapsed())),
                              log_path=work / f"finetune-{intervention}.log")
            if res["rc"] != 0:
                raise RuntimeError(f"recurlen finetune exited {res['rc']}; see {res['log']}")
            tok_s = tb_scalars(run_dir, "train/tokens_per_s")[1:]  # the first step includes autotuning
            losses = tb_scalars(run_dir, "train/loss")
            res.update(tokens_per_s=round(sum(tok_s) / len(tok_s)) if tok_s else None,
                       first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None)
            peaks = tb_scalars(run_dir, "train/peak_gpu_memory_gib")
            res["peak_gpu_gib"] = round(max(peaks), 2) if peaks else None
            return res
        summary.part(f"finetune_{intervention}", finetune, budget=budget, needs_s=60)

        # 5. chunked evaluation of one long sequence, once the TBTT run exists
        if intervention == "tbptt" and "finetune_tbptt" not in summary.data["failures"] + summary.data["skipped"]:
            def evaluate() -> dict:
                run_dir = tmp / "runs" / "tbptt"
                res = run_command([sys.executable, "-m", "recurlen", "eval", f"tbptt={run_dir}",
                                   f"seq_len={args.eval_len}", "num_sequences=1", "batch_size=1", "chunk_len=2048",
                                   "bf16=true", "backend=kernel", "tasks=[positionwise,state]", "progress=false",
                                   "data.val_mode=pack", "--out", str(tmp / "eval")],
                                  timeout=int(max(30, budget - summary.elapsed())), log_path=work / "eval.log")
                if res["rc"] != 0:
                    raise RuntimeError(f"recurlen eval exited {res['rc']}; see {res['log']}")
                run = json.loads((tmp / "eval" / "results.json").read_text())["runs"][0]
                bins = run["positionwise"]["bins"]
                res.update(seq_len=run["seq_len"], tokens_per_s=round(args.eval_len / res["seconds"]),
                           loss_by_bin={b["name"]: b["loss"] for b in bins})
                if any(b["loss"] is None for b in bins):
                    raise RuntimeError("non-finite loss in the chunked evaluation")
                return res
            summary.part("eval_long", evaluate, budget=budget, needs_s=60)

    # 6. FSDP, 2 processes
    if torch.cuda.device_count() >= 2:
        def fsdp() -> dict:
            run_dir = tmp / "runs" / "fsdp-tbptt"
            res = run_command(finetune_cmd(checkpoint, corpus, run_dir, "tbptt", steps=min(args.steps, 5),
                                           batch=args.batch or 8, devices=2, strategy="fsdp"),
                              timeout=int(max(30, budget - summary.elapsed())), log_path=work / "fsdp.log")
            if res["rc"] != 0:
                raise RuntimeError(f"FSDP finetune exited {res['rc']}; see {res['log']}")
            ranks = sorted(json.loads(p.read_text())["global_rank"] for p in (run_dir / "ranks").glob("rank*.json"))
            if ranks != [0, 1]:
                raise RuntimeError(f"expected ranks [0, 1] to report; got {ranks}")
            return res
        summary.part("fsdp_2_processes", fsdp, budget=budget, needs_s=90)
    else:
        summary.data["steps"]["fsdp_2_processes"] = {"skipped": f"{torch.cuda.device_count()} GPU(s); needs 2"}
    return summary.finish()


if __name__ == "__main__":
    sys.exit(main())
