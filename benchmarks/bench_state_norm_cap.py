"""What Stuffed Mamba's state norm cap (fix stuffed_mamba, `state_norm`) costs a Mamba-2 forward on CPU.

    .venv/bin/python benchmarks/bench_state_norm_cap.py               # nano and tiny, 4096 tokens, one thread
    .venv/bin/python benchmarks/bench_state_norm_cap.py --quick       # 1024 tokens (make bench)

The cap, h_t <- h_t min(1, cap / ||h_t||) per head after every token, is not linear in the state, so a capped layer
runs a token-by-token scan instead of the chunked SSD scan. Both run here on the same model and tokens (batch 1, calls
of 256 tokens with the state carried, as the evaluation does), in rounds with the order alternated, medians reported;
the ratio is chunked / capped tokens per second. The cap is set high enough never to bind, so both do the same math.
"""

from __future__ import annotations

import argparse
import statistics

import _common
import torch

from recurlen import Mamba2LM, preset


def tokens_per_second(model: Mamba2LM, ids: torch.Tensor, *, chunk: int) -> float:
    def run() -> None:
        with torch.no_grad():
            state = None
            for start in range(0, ids.shape[1], chunk):
                _, state = model(ids[:, start:start + chunk], state)

    return ids.shape[1] / _common.timed(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["nano", "tiny"])
    parser.add_argument("--tokens", type=int, default=None, help="tokens per run (default 4096; --quick 1024)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    _common.add_results_option(parser)
    args = parser.parse_args()
    threads = _common.set_threads(args.threads)
    _common.print_environment("state norm cap: token-by-token capped scan vs the chunked scan", threads)
    tokens = args.tokens or (1024 if args.quick else 4096)
    for shape in args.shapes:
        torch.manual_seed(0)
        model = Mamba2LM(preset(shape), backend="torch").eval()
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1))
        caps = [None, torch.full((model.config.nheads,), 1e30)]
        speed: dict[str, list[float]] = {"chunked": [], "capped": []}
        for r in range(args.repeats + 1):  # round 0 warms up
            for name, cap in (zip(speed, caps) if r % 2 == 0 else reversed(list(zip(speed, caps)))):
                for mixer in (block.mixer for block in model.layers):
                    mixer.state_norm_max = cap
                value = tokens_per_second(model, ids, chunk=256)
                if r:
                    speed[name].append(value)
        chunked, capped = statistics.median(speed["chunked"]), statistics.median(speed["capped"])
        cfg = model.config
        what = f"{shape} (d_model {cfg.d_model}, {cfg.n_layer} layers, d_state {cfg.d_state}), 1 x {tokens}"
        print(f"{what}: chunked {chunked:,.0f} tokens/s, capped {capped:,.0f} tokens/s: the cap costs "
              f"{chunked / capped:.1f}x")
        _common.record(args.results, benchmark="state norm cap (capped scan)", shape=what, unit="tokens/s",
                       recurlen=capped, peers={"chunked": chunked}, ratios={"chunked": capped / chunked},
                       target="none (the cost of an exact cap)")


if __name__ == "__main__":
    main()
