"""recurlen's command line.

  recurlen finetune [experiment=NAME] [group=choice ...] [a.b=value ...]   post-train (or pre-train) a model
  recurlen config   [same overrides]                                       print the resolved config
  recurlen fit-noise [same overrides] [--out FILE]                         fit the fitted-noise statistics
  recurlen generate --model PRESET|--checkpoint PATH --prompt TEXT         greedy continuation
  recurlen eval [label=]CKPT ... [--data GROUP] [--out DIR] [key=value ...]   long-context evaluation
  recurlen report RESULTS.json ... --out DIR                               report.md + plots
  recurlen demo [key=value ...]                                            the CPU demo (make demo)
  recurlen passkey|babilong|copying [experiment=NAME] [a.b=value ...]      long-context tasks (train + evaluate)
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

log = logging.getLogger("recurlen")


def _setup_logging() -> None:
    # Only recurlen's own logger gets a handler: Lightning already prints its messages once.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger("recurlen")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    # Known-harmless library warnings that would otherwise greet every run.
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", message=".*IterableDataset. has .__len__. defined.*")


def cmd_config(args: list[str]) -> int:
    from omegaconf import OmegaConf

    from recurlen.experiment.compose import compose, to_object

    cfg = compose(args)
    to_object(cfg)  # validate before printing
    sys.stdout.write(OmegaConf.to_yaml(cfg, resolve=True))
    return 0


def cmd_finetune(args: list[str]) -> int:
    from recurlen.experiment.compose import load_experiment
    from recurlen.train import run_finetune

    cfg, resolved = load_experiment(args)
    run_dir = run_finetune(cfg, resolved)
    log.info("run directory: %s (tensorboard --logdir %s)", run_dir, run_dir)
    return 0


def cmd_fit_noise(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recurlen fit-noise", description="Fit per (layer, head) Gaussian "
                                     "statistics of final SSM states on training batches.")
    parser.add_argument("--out", default=None, help="output file (default <run_dir>/fitted_noise.pt)")
    parser.add_argument("overrides", nargs="*", help="experiment overrides, as for finetune")
    ns = parser.parse_args(argv)
    from pathlib import Path

    from recurlen.data.datamodule import RecurlenDataModule
    from recurlen.experiment.compose import load_experiment
    from recurlen.lit_module import RecurlenModule
    from recurlen.runs import RunDir
    from recurlen.train import build_model

    cfg, _ = load_experiment(ns.overrides)
    dm = RecurlenDataModule(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    model = build_model(cfg)
    dm.check_model_vocab(model.config.vocab_size)
    module = RecurlenModule(model, intervention=cfg.intervention, optim=cfg.optim, seed=cfg.seed,
                            train_seq_len=cfg.data.seq_len, tokenizer=cfg.data.tokenizer, total_steps=1)
    n = cfg.intervention.fit_batches
    stats = module.fit_noise((dm.train_batch(s) for s in range(n)), num_batches=n)
    out = Path(ns.out) if ns.out else RunDir(cfg.resolved_run_dir).fitted_noise
    stats.save(str(out))
    log.info("fitted noise on %d final states of length %d: |mean| %.4g, std %.4g -> %s", stats.num_states,
             stats.seq_len, stats.mean_KH.abs().mean().item(), stats.std_KH.mean().item(), out)
    return 0


def cmd_generate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recurlen generate", description="Greedy continuation with the state.")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", default="tiny", help="a preset, randomly initialised (smoke check)")
    src.add_argument("--checkpoint", default=None, help="run checkpoint, run dir, or pretrained dir / hub id")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: the checkpoint's, or bytes)")
    parser.add_argument("--prompt", default="def main(")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    ns = parser.parse_args(argv)
    import torch

    from recurlen import Mamba2LM, preset
    from recurlen.generation import greedy_generate
    from recurlen.runs import load_model
    from recurlen.tokenizer import load_tokenizer

    if ns.checkpoint:
        loaded = load_model(ns.checkpoint)
        model, tok_spec = loaded.model, ns.tokenizer or loaded.tokenizer or "bytes"
    else:
        torch.manual_seed(0)
        model, tok_spec = Mamba2LM(preset(ns.model)), ns.tokenizer or "bytes"
    tok = load_tokenizer(tok_spec)
    ids = torch.tensor([tok.encode(ns.prompt)])
    out = greedy_generate(model.eval(), ids, max_new_tokens=ns.max_new_tokens, stop_ids={tok.eos_id})
    sys.stdout.write(ns.prompt + tok.decode(out[0].tolist()) + "\n")
    log.info("%d-token prompt, %d new tokens, %.2fM parameters", ids.shape[1], out.shape[1],
             model.num_parameters() / 1e6)
    return 0


def _lazy(module: str, name: str):
    def run(argv: list[str]) -> int:
        import importlib

        return getattr(importlib.import_module(module), name)(argv)

    return run


COMMANDS = {
    "finetune": (cmd_finetune, "post-train (or pre-train) a model with an initial-state intervention"),
    "train": (cmd_finetune, "alias of finetune"),
    "config": (cmd_config, "print the resolved experiment config"),
    "fit-noise": (cmd_fit_noise, "fit the fitted-noise statistics on training batches"),
    "generate": (cmd_generate, "greedy continuation from a prompt"),
    "eval": (_lazy("recurlen.eval_cli", "cmd_eval"), "position-wise loss, reset control, state norms, EffRem"),
    "report": (_lazy("recurlen.eval_cli", "cmd_report"), "Markdown report + plots from results.json files"),
    "demo": (_lazy("recurlen.eval_cli", "cmd_demo"), "the CPU demo: failure past T and its fix, with a report"),
    "passkey": (_lazy("recurlen.tasks.cli", "cmd_passkey"), "passkey retrieval: a key hidden in long prompts"),
    "babilong": (_lazy("recurlen.tasks.cli", "cmd_babilong"), "BABILong: reasoning over facts hidden in long text"),
    "copying": (_lazy("recurlen.tasks.cli", "cmd_copying"), "synthetic copying: copy a sequence after a long gap"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        lines = [__doc__.strip(), "", "commands:"] + [f"  {k:10s} {v[1]}" for k, v in COMMANDS.items()]
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"recurlen: unknown command {name!r}; allowed: {sorted(COMMANDS)}\n")
        return 2
    _setup_logging()
    try:
        return COMMANDS[name][0](rest)
    except (ValueError, FileNotFoundError) as err:
        sys.stderr.write(f"recurlen {name}: error: {err}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
