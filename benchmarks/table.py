"""The make bench table: every benchmark's headline rows, as the scripts recorded them with --results FILE.

    python benchmarks/table.py --start runs/bench/results.jsonl   # empty FILE before a make bench run
    python benchmarks/table.py runs/bench/results.jsonl           # print the table (Markdown)

A row (one JSON object per line, written by _common.record):
    benchmark, shape      what was measured, and on what (model shape, batch x length)
    unit, recurlen        recurlen's value and its unit (tokens/s for training steps)
    peers                 each peer's value in the same unit, measured in the same process, interleaved
    ratios                recurlen against each peer (throughput: recurlen / peer; costs: as the script defines)
    pct_of_peak           achieved model FLOP/s / the largest float32 matmul peak of the run, if measured
    peak                  GFLOP/s before / between the repeats (largest) / after, and the load at both ends
    load_start, load_end  the 1-minute load average when the script started and when it recorded the row
    target                the target the script checks
"""

from __future__ import annotations

import argparse
import json
import os


def fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def cells(row: dict) -> list[str]:
    unit = row.get("unit", "")
    peers = ", ".join(f"{name} {fmt(v)}" for name, v in row.get("peers", {}).items()) or "-"
    ratios = ", ".join(f"**{r:.2f}x** {name}" for name, r in row.get("ratios", {}).items()) or "-"
    pct = row.get("pct_of_peak")
    peak = row.get("peak")
    if peak:
        between = peak["between"] if peak["between"] is not None else "-"
        peaks = f"{peak['before']} / {between} / {peak['after']}"
        load = f"{peak['load_start']:.1f} / {peak['load_end']:.1f}"
    else:
        peaks = "-"
        load = f"{row['load_start']:.1f} / {row['load_end']:.1f}"
    return [row["benchmark"], row["shape"], f"{fmt(row['recurlen'])} {unit}".strip(), peers, ratios,
            "-" if pct is None else f"{pct:.1%}", peaks, load, row.get("target", "")]


HEADER = ["benchmark", "shape", "recurlen", "peers (same unit)", "recurlen vs each peer", "% of peak",
          "peak GFLOP/s before / between / after", "load start / end", "target"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="the JSON-lines file the benchmarks wrote with --results")
    parser.add_argument("--start", action="store_true", help="create (or empty) the file and exit")
    args = parser.parse_args()
    if args.start:
        os.makedirs(os.path.dirname(args.results) or ".", exist_ok=True)
        open(args.results, "w").close()
        return
    if not os.path.exists(args.results):
        raise SystemExit(f"{args.results}: no such file (run the benchmarks with --results {args.results} first)")
    with open(args.results) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{args.results}: no rows (did the benchmarks run with --results {args.results}?)")
    print("\n| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(cells(row)) + " |")
    print(f"\n{len(rows)} rows; % of peak divides by the largest float32 matmul peak measured in the script's own "
          "process (before the model, between its timed repeats, after it); load = the 1-minute load average.")


if __name__ == "__main__":
    main()
