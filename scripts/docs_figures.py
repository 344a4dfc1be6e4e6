"""Regenerate the figures and the model-card example of docs/ from a finished demo, with the numbers each is drawn
from in docs/figures.json (tests/test_docs_figures.py compares those with the table docs/demo.md records).

    make demo                                          # runs/demo: report.md, results.json, the plots, TensorBoard
    .venv/bin/python scripts/docs_figures.py runs/demo # -> docs/*.png, docs/model-card-example.md, docs/figures.json

From the demo's report (copied): compare_full_minus_reset.png, demo_full_minus_reset.png, demo_loss_by_position.png.
From TensorBoard over the demo's runs (served on 127.0.0.1, screenshot by headless Chromium at 1600 px):
tensorboard_compare.png (Images, the compare run), tensorboard_hparams.png (HParams), tensorboard_bins.png (Custom
Scalars). From `recurlen export` of the state-passing run with the demo's evaluation: model-card-example.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINS = ["[0,T)", "[4T,8T)", "[8T,16T)", "[16T,32T)"]
"""The columns of docs/demo.md's table: the loss in context, full - reset in the far bins."""
REPORT_FIGURES = {"compare_full_minus_reset.png": "compare_full_minus_reset.png",
                  "demo_full_minus_reset.png": "full_minus_reset.png",
                  "demo_loss_by_position.png": "loss_by_position.png"}
"""docs/ name -> the report's file."""
TENSORBOARD_FIGURES = {"tensorboard_compare.png": "#images&tagFilter=compare",
                       "tensorboard_hparams.png": "#hparams",
                       "tensorboard_bins.png": "#custom_scalars"}
CARD_RUN = "state_passing"


def table_numbers(results: dict) -> dict[str, dict[str, float]]:
    """{run: {'[0,T)': loss, '[4T,8T)': full - reset, ...}} as the report shows them (3 decimals)."""
    out = {}
    for run in results["runs"]:
        rows = {r["name"]: r for r in (run.get("positionwise") or {}).get("bins", [])}
        values = {"[0,T)": rows["[0,T)"]["loss"]} if "[0,T)" in rows else {}
        values.update({b: rows[b]["full_minus_reset"] for b in BINS[1:] if b in rows})
        out[run["label"]] = {k: round(v, 3) for k, v in values.items()}
    return out


def copy_report_figures(root: Path, docs: Path) -> list[str]:
    for name, source in REPORT_FIGURES.items():
        shutil.copyfile(root / source, docs / name)
    return list(REPORT_FIGURES)


def screenshot_tensorboard(root: Path, docs: Path) -> dict[str, dict]:
    """Each TensorBoard view as a 1600 px screenshot; the HParams rows as TensorBoard serves them (the `val`
    columns: the training runs' own validation, not the report's evaluation)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("headless Chromium is needed for the TensorBoard screenshots (apt-get install chromium)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("tensorboard")
    proc = subprocess.Popen([str(exe), "--logdir", str(root), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{base}/data/runs", timeout=5) as resp:
                    if "compare" in resp.read().decode():
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit("TensorBoard did not serve the demo's runs within 180 s")
            time.sleep(1)
        hparams = _hparams_rows(base)
        for name, view in TENSORBOARD_FIGURES.items():
            with tempfile.TemporaryDirectory() as profile:
                subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                f"--user-data-dir={profile}", "--window-size=1600,1000",
                                "--virtual-time-budget=30000", f"--screenshot={docs / name}", f"{base}/{view}"],
                               check=True, capture_output=True, timeout=300)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"tensorboard_hparams.png": {"val": hparams}}


def _hparams_rows(base: str) -> dict[str, dict[str, float]]:
    """{run: {metric column heading: value}} of the HParams table, from TensorBoard's own data API."""
    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read().decode())

    experiment = post("/data/plugin/hparams/experiment", {"experimentName": ""})
    headings = {m["name"]["tag"]: m.get("displayName") or m["name"]["tag"] for m in experiment["metricInfos"]}
    groups = post("/data/plugin/hparams/session_groups", {
        "experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                                                  "STATUS_RUNNING"], "colParams": [], "startIndex": 0,
        "sliceSize": 100})
    rows = {}
    for group in groups["sessionGroups"]:
        values = {headings[m["name"]["tag"]]: round(m["value"], 3) for m in group.get("metricValues", [])
                  if m["name"]["tag"] in headings}
        rows[group["hparams"].get("run") or group["name"]] = values
    return rows


def model_card(root: Path, docs: Path) -> str:
    """The state-passing run exported with the demo's evaluation; its README.md, paths shown from the project."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "card"
        subprocess.run([sys.executable, "-m", "recurlen", "export", str(root / "post" / CARD_RUN), "--out", str(out),
                        "format=transformers", "--eval", str(root / "eval")], check=True, cwd=ROOT)
        text = (out / "README.md").read_text()
    # As a user's card reads when exported to exports/demo-sp (the temporary directory shows as DIR), with the plots,
    # which lie beside README.md in the export and not in docs/, named instead of embedded.
    text = text.replace("--out DIR ", "--out exports/demo-sp ")
    text = re.sub(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)", r"(plot `\2`: \1)", text)
    command = (f"recurlen export {root.as_posix()}/post/{CARD_RUN} --out exports/demo-sp format=transformers "
               f"--eval {root.as_posix()}/eval")
    head = ("> **An example.** The model card `recurlen export` wrote for the demo's state-passing run (`make demo`),"
            f"\n> regenerated by `scripts/docs_figures.py`: `{command}`.\n> Its plots lie next to README.md in the "
            "export directory; here they are named instead of embedded.\n\n")
    (docs / "model-card-example.md").write_text(head + text)
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("runs/demo"), help="a finished demo's runs")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where the figures go")
    parser.add_argument("--no-tensorboard", action="store_true", help="leave the TensorBoard screenshots as they are")
    parser.add_argument("--no-card", action="store_true", help="leave model-card-example.md as it is")
    args = parser.parse_args(argv)
    results_path = args.root / "results.json"
    if not results_path.is_file():
        raise SystemExit(f"{results_path} is missing: run the demo first (make demo)")
    results = json.loads(results_path.read_text())
    numbers = table_numbers(results)
    drawn = "the evaluation's full - reset and loss by position (results.json)"
    figures = {name: {"drawn_from": drawn, "numbers": "table"} for name in copy_report_figures(args.root, args.docs)}
    if not args.no_tensorboard:
        for name, extra in {"tensorboard_compare.png": {}, "tensorboard_bins.png": {},
                            **screenshot_tensorboard(args.root, args.docs)}.items():
            figures[name] = {"drawn_from": "TensorBoard over the demo's runs", **extra}
    sidecar = {"command": f"make demo && .venv/bin/python scripts/docs_figures.py {args.root.as_posix()}",
               "demo": args.root.as_posix(), "table": numbers,
               "checks": [{"check": c["check"], "value": round(c["value"], 3), "passed": c["passed"]}
                          for c in results.get("checks", []) if c.get("value") is not None],
               "figures": figures}
    if not args.no_card:
        sidecar["figures"]["model-card-example.md"] = {"drawn_from": model_card(args.root, args.docs),
                                                      "numbers": f"table[{CARD_RUN}]"}
    # A figure left as it is (--no-tensorboard, --no-card) keeps its entry only while the demo's numbers are those
    # it was drawn from; otherwise it has none, and the docs test says which figure is stale.
    earlier_path = args.docs / "figures.json"
    earlier = json.loads(earlier_path.read_text()) if earlier_path.is_file() else {}
    if earlier.get("table") == numbers:
        for name, entry in earlier.get("figures", {}).items():
            sidecar["figures"].setdefault(name, entry)
    (args.docs / "figures.json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(f"{args.docs / 'figures.json'}: {len(sidecar['figures'])} figures from {args.root}")
    for label, values in numbers.items():
        print(f"  {label:14s} " + "  ".join(f"{k} {v:+.3f}" for k, v in values.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
