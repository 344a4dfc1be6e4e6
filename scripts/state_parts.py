"""What each part of a trained run's recurrent state carries across a cut: the held-out loss change (nats/token,
against the uncut run) when, at the cut, each window part, each recurrent part, every window (`recurrent_only()`,
what state passing carries by default) or everything (a reset) is zeroed, by distance from the cut. The parts are
the state type's own (RECURRENT, WINDOW), so any architecture's run can be measured.

    .venv/bin/python scripts/state_parts.py RUN_DIR [--cuts 32 256] [--sequences 32] [--after 256]

The held-out sequences are the run's own data (recurlen.evaluation.heldout), cut + after + 1 tokens each.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from recurlen.evaluation.heldout import heldout_sequences, run_data_config
from recurlen.training.run_dir import load_model


def bins(after: int) -> dict[str, tuple[int, int]]:
    edges = [(0, 1, "first token"), (1, 8, "next 7"), (8, 32, "tokens 8-31"), (32, after, f"tokens 32-{after - 1}")]
    return {name: (lo, min(hi, after)) for lo, hi, name in edges if lo < after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--cuts", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--after", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.run, backend="torch").model.eval()
    length = max(args.cuts) + args.after + 1
    seqs = heldout_sequences(run_data_config(args.run), length=length, num=args.sequences)
    with torch.no_grad():
        for cut in args.cuts:
            x = seqs[:, :cut + args.after + 1]
            full, _ = model(x[:, :-1])
            targets = x[:, cut + 1:]
            ref = F.cross_entropy(full[:, cut:].transpose(1, 2), targets, reduction="none")
            _, state = model(x[:, :cut])
            parts = state.parts()
            rows = {"everything carried": state}
            for name in (*state.WINDOW, *state.RECURRENT):
                rows[f"{name} zeroed"] = type(state)(**{**parts, name: torch.zeros_like(parts[name])})
            rows["every window zeroed (recurrent_only())"] = state.recurrent_only()
            rows["all zeroed (a reset)"] = state.zeros_like()
            print(f"cut at {cut}: loss after the cut {float(ref.mean()):.3f} nats/token, {len(x)} sequences")
            for name, start in rows.items():
                logits, _ = model(x[:, cut:-1], start)
                delta = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") - ref
                cells = ", ".join(f"{b} {float(delta[:, lo:hi].mean()):+.3f}"
                                  for b, (lo, hi) in bins(args.after).items())
                print(f"  {name}: {cells}")


if __name__ == "__main__":
    main()
