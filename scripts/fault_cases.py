"""Re-run docs/fault-cases.md: every row whose outcome a run can show, the documented outcome beside the observed one.

    .venv/bin/python scripts/fault_cases.py                  # every row; exit 1 when one differs
    .venv/bin/python scripts/fault_cases.py --rows 36,43-51  # some rows
    .venv/bin/python scripts/fault_cases.py --no-tests       # only the rows re-run as commands

Two ways a row is checked, both when it has both:
- its evidence names tests (`tests/...py::test[param]`; "same test" refers to the row above): they are run in one
  pytest call, the slow tier included. A name the suite no longer has is a difference (the table is stale).
- it is one of COMMANDS below: the command is run as the table gives it, with the table's settings (`$B`, `$C`)
  in a scratch directory, and compared with the documented outcome: the exit code of its class (2 for "clear error"
  and "refused", 0 for "other", or the "exit N" the row states), every piece of its first quoted text (split at "…",
  the table's placeholders RUN, D, xc filled in; later quotes tell variants) in the output, the run directory
  untouched by a refusal, and "bitwise" weights equal to the uninterrupted run's.
A row with neither is printed as not re-run, with the reason the table gives (minutes and 17 GiB, timing-dependent
signals, a root-only mount); it counts neither way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "fault-cases.md"
B = ["model=nano", "data.seq_len=16", "data.batch_size=4", "trainer.val_every_n_steps=0",
     "diagnostics.positionwise=false", "diagnostics.state_norm=false", "trainer.num_threads=1",
     "trainer.accelerator=cpu", "data.max_documents=200", "data.val_length=64", "data.val_sequences=2",
     "data.val_fraction=0.2", "trainer.progress_bar=false"]
C = ["intervention=state_passing", "trainer.max_steps=40", "trainer.checkpoint_every_n_steps=10"]
CLASSES = {"resumed, identical": None, "clear error, nothing lost": 2, "refused, nothing lost": 2, "other": 0}

FINETUNE = ["finetune", *B, *C]
COMMANDS: dict[str, dict] = {
    "3": {"argv": [*FINETUNE, "optim.lr=50", "trainer.checkpoint_every_n_steps=2", "run_dir={D}"],
          "advice": "{D}"},
    "4": {"argv": [*FINETUNE, "optim.lr=1e6", "optim.warmup_steps=0", "optim.grad_clip=0", "run_dir={D}"]},
    "14": {"argv": [*FINETUNE, "name=../../escape"], "cwd": "{W}/cwd14/a/b", "absent": "{W}/cwd14/a/escape"},
    "16": {"argv": [*FINETUNE, "run_dir={W}/xc", "resume={RUN}/checkpoints/last.ckpt", "seed=1"],
           "absent": "{W}/xc", "untouched": True},
    "17": {"argv": [*FINETUNE, "resume=yes", "run_dir={D}"], "absent": "{D}"},
    "36": {"argv": [*FINETUNE, "run_dir={D}"], "setup": "plant_mamba1", "places": {"RUN": "{D}"},
           "untouched": "{D}"},
    "37": {"argv": [*FINETUNE, "run_dir={D}", "resume={M1RUN}/checkpoints/last.ckpt"], "absent": "{D}"},
    "43": {"argv": [*FINETUNE, "run_dir={RUN}", "trainer.max_steps=50", "intervention=fitted_noise"],
           "untouched": True},
    **{str(n): {"argv": [*FINETUNE, "run_dir={RUN}", o], "untouched": True} for n, o in (
        (44, "model=tiny"), (45, "data.batch_size=8"), (46, "seed=1"), (47, "data.seq_len=32"), (48, "data.seed=1"),
        (49, "intervention.reset_prob=0.5"), (50, "data.max_documents=100"),
        (51, "trainer.accumulate_grad_batches=2"))},
    "52": {"argv": [*FINETUNE, "model.architecture=mamba1", "run_dir={D}"], "absent": "{D}"},
    "53": {"argv": [*FINETUNE, "run_dir={D}", "optim.lr=5e-5", "trainer.max_steps=50"], "setup": "copy_run"},
    "54": {"argv": [*FINETUNE, "run_dir={RUN}", "trainer.max_steps=20"], "untouched": True},
    **{str(n): {"argv": [*FINETUNE, o, "run_dir={D}"], "absent": "{D}"} for n, o in (
        (65, "trainer.max_stepz=10"), (66, "data.seq_len=abc"), (67, "data.seq_len=0"), (68, "data.seq_len=-4"),
        (69, "data.batch_size=0"), (70, "optim.lr=-1"), (71, "trainer.max_steps=-5"), (72, "trainer.max_steps=0"),
        (73, "model=nonexistent"), (74, "intervention=nonexistent"), (76, "optim.betas=[0.9,1.5]"),
        (77, "trainer.devices=abc"), (78, "trainer.devices=0"), (79, "trainer.accelerator=gpu"),
        (80, "data.val_fraction=1.5"), (82, "optim.grad_clip=-1"), (83, "trainer.checkpoint_every_n_steps=-1"),
        (85, "data.tokenizer={W}/absent/tokenizer.json"), (86, "optim.schedule=bogus"))},
    "75": {"argv": [*FINETUNE, "intervention=random_noise", "intervention.noise_std=-1", "run_dir={D}"],
           "absent": "{D}"},
    "81": {"argv": [*FINETUNE, "intervention=fitted_noise", "intervention.fit_refresh=ema", "intervention.fit_ema=1",
                    "run_dir={D}"], "absent": "{D}"},
    "84": {"argv": [*FINETUNE, "intervention=tbptt", "intervention.tbptt_segments=0", "run_dir={D}"],
           "absent": "{D}"},
    "88": {"argv": ["eval", "x={RUN}", "seq_len=64", "num_sequences=2", "--out", "{W}/e88"],
           "present": "{W}/e88/results.json"},
    "89": {"argv": ["eval", "x={W}/nope"]},
    "90": {"argv": ["eval", "x={D}"], "setup": "config_only", "places": {"D": "{D}"}},
    "94": {"argv": ["eval", "x={RUN}", "seq_lenn=64"]},
    "95": {"argv": ["report", "{W}/nope.json", "--out", "{W}/r95"]},
    "96": {"argv": ["report", "{W}/half.json", "--out", "{W}/r96"], "setup": "half_json"},
    "97": {"argv": ["report", "{W}/list.json", "--out", "{W}/r97"], "setup": "list_json"},
    "98": {"argv": ["report", "{W}/e88/results.json", "--out", "{W}/r98"], "needs": "88",
           "present": "{W}/r98/report.md"},
    "99": {"argv": [*FINETUNE, "run_dir={W}/p/q/../dotdot"], "setup": "mkdir_pq", "weights": "{W}/p/dotdot"},
    "100": {"argv": [*FINETUNE, "run_dir={W}/with space/ünï cödé"], "weights": "{W}/with space/ünï cödé"},
    "101": {"argv": [*FINETUNE, "run_dir=rel/run"], "cwd": "{W}/cwd101", "weights": "{W}/cwd101/rel/run"},
    # Trust II
    "201": {"argv": ["eval", "{D}/export", "seq_len=64", "num_sequences=8", "--out", "{D}/eval"], "setup": "export_run",
            "present": "{D}/eval/results.json"},
    "204": {"argv": [*FINETUNE, "run_dir={D}"], "present": "{D}/checkpoints/last.ckpt"},
    "205": {"argv": [*FINETUNE, "data.layout=packed", "data.val_segments=0", "data.val_sequences=0", "run_dir={D}"],
            "present": "{D}/checkpoints/last.ckpt"},
    "208": {"argv": ["demo", "quick=true", "run_root={D}", "--dry-run"], "absent": "{D}"},
    **{str(n): {"argv": [*FINETUNE, "data.source={W}/big.jsonl", "data.tokenize=needed", "data.num_proc=2",
                         "run_dir={D}"], "setup": "big_jsonl", "absent": "{D}",
                "env": {"RECURLEN_FAULT": f"point=tokenize,chunk=0,action={action}"}}
       for n, action in ((213, "stall"), (214, "kill"))},
    "215": {"argv": [*FINETUNE, "data.source={W}/mixed.jsonl", "data.tokenize=needed", "run_dir={D}"],
            "setup": "mixed_jsonl", "present": "{D}/checkpoints/last.ckpt"},
    "216": {"argv": [*FINETUNE, "data.source={W}/empty.jsonl", "data.tokenize=needed", "run_dir={D}"],
            "setup": "bad_data", "absent": "{D}"},
    "217": {"argv": [*FINETUNE, "data.source={W}/text.jsonl.zst", "data.tokenize=needed", "run_dir={D}"],
            "setup": "bad_data", "places": {"F": "{W}/text"}, "absent": "{D}"},
    "218": {"argv": [*FINETUNE, "data.source={W}/damaged.jsonl.zst", "data.tokenize=all", "run_dir={D}"],
            "setup": "bad_data", "places": {"F": "{W}/damaged"}, "absent": "{D}"},
    **{str(n): {"argv": [task, "model=nano", "task.lengths=[8]", "run_dir={D}"], "absent": "{D}"}
       for n, task in ((219, "niah"), (220, "passkey"))},
    "221": {"argv": ["export", "{RUN}", "--out", "{W}/a-file/out"], "setup": "a_file", "places": {"F": "{W}/a-file"},
            "absent": "{W}/a-file/out"},
    "222": {"argv": ["export", "{RUN}", "--out", "{D}", "card=false"], "absent": "{D}",
            "env": {"RECURLEN_FAULT": "point=start,file=pytorch_model.bin,action=enospc"}},
    **{str(n): {"argv": ["eval", "x={RUN}", *words, "--out", "{D}"], "absent": "{D}"} for n, words in (
        (223, ["fixes=[mambaextend]", "fix.mambaextend.method=backprop", "fix.mambaextend.lr=nan"]),
        (224, ["fixes=[forget_more]", "fix.forget_more.memory=nan"]),
        (225, ["fixes=[forget_more]", "fix.forget_more.grid=[nan]"]),
        (226, ["fixes=[mambaextend]", "fix.mambaextend.perturb=nan"]),
        (232, ["num_sequence=4"]))},
    "229": {"argv": ["niah", "task.train=false", "model.pretrained={RUN}", "task.lengths=[1000000000]", "run_dir={D}",
                     "--dry-run"], "absent": "{D}"},
    "230": {"argv": [*FINETUNE, "trainer.loggers=wandb", "run_dir={D}"], "absent": "{D}"},
    "231": {"argv": [*FINETUNE, "trainer.loggers=[wandb,mlflow]", "run_dir={D}"], "absent": "{D}"},
    "233": {"argv": ["eval", "--help"]},
}
"""Rows re-run as commands (after `recurlen`): {RUN} the finished run `finetune $B $C`, {M1RUN} the same on
mamba1-nano, {D} a fresh directory of the row, {W} the scratch directory. env: set for the command (a fault hook's
RECURLEN_FAULT, which other commands never inherit). absent: must not exist afterwards;
present: must exist; untouched: RUN (or the path given) keeps every file's md5; weights: the run trained there ends
bitwise equal to RUN; places: what the table's placeholders stand for in its quotes (besides RUN, D and xc)."""


@dataclass
class Row:
    number: str
    case: str
    command: str
    outcome: str
    evidence: str
    tests: list[str] = field(default_factory=list)

    @property
    def klass(self) -> str:
        return next((k for k in CLASSES if self.outcome.startswith(k)), "other")

    def quotes(self) -> list[str]:
        return re.findall(r'"([^"]+)"', self.outcome)


def parse_table(text: str) -> list[Row]:
    rows, previous = [], []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) != 5 or not re.fullmatch(r"\d+[a-c]?", cells[0]):
            continue
        row = Row(*cells)
        row.tests = _tests_named(row.evidence, previous)
        previous = row.tests or previous
        rows.append(row)
    return rows


def _tests_named(evidence: str, previous: list[str]) -> list[str]:
    """The pytest ids a row's evidence names; 'same test' / 'same tests' (with a `[param]`) refer to the row above."""
    out: list[str] = []
    for span in re.findall(r"`([^`]+)`", evidence):
        if span.startswith("tests/") and "::" in span:
            out.append(span)
        elif span.startswith("::") and out:
            out.append(out[-1].split("::")[0] + span)
        elif span.startswith("tests/") and span.endswith(".py"):
            out.append(span)
        elif re.fullmatch(r"\[[^\]]+\]", span) and (out or previous):
            base = (out or previous)[-1].split("[")[0]
            out.append(base + span)
        elif span.startswith("test_") and "[" in span and (out or previous):
            out.append((out or previous)[-1].split("::")[0] + "::" + span)
    if not out and re.search(r"\bsame tests?\b", evidence):
        out = list(previous)
    return out


# ------------------------------------------------------------------------------------------------ the tests

def run_tests(rows: list[Row], work: Path) -> dict[str, tuple[str, str]]:
    """{named id: (observed, detail)}: 'passed', 'failed', 'skipped' or 'no such test'."""
    named = sorted({t for r in rows for t in r.tests})
    if not named:
        return {}
    files = sorted({t.split("::")[0] for t in named if (ROOT / t.split("::")[0]).is_file()})
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow or not slow",
                                "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True, text=True)
    real = [line.strip() for line in collected.stdout.splitlines() if "::" in line]
    chosen: dict[str, list[str]] = {}
    for t in named:
        path, _, name = t.partition("::")
        if not name:
            chosen[t] = [r for r in real if r.startswith(path + "::")]
            continue
        base, _, param = name.partition("[")
        same = [r for r in real if r.split("[")[0] == f"{path}::{base}"]
        if param:
            want = param.rstrip("]")
            exact = [r for r in same if r == t]
            same = exact or [r for r in same if want in r.split("[", 1)[-1]]
        chosen[t] = same
    ids = sorted({i for v in chosen.values() for i in v})
    xml = work / "tests.xml"
    print(f"running {len(ids)} tests named as evidence ...", flush=True)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "slow or not slow", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", *ids], cwd=ROOT, capture_output=True, text=True)
    outcome: dict[str, tuple[str, str]] = {}
    if xml.is_file():
        for case in ET.parse(xml).getroot().iter("testcase"):
            file = case.get("classname", "").replace(".", "/") + ".py"
            node = f"{file}::{case.get('name')}"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            skip = case.find("skipped")
            if bad is not None:
                outcome[node] = ("failed", (bad.get("message") or "")[:200])
            elif skip is not None:
                outcome[node] = ("skipped", (skip.get("message") or "")[:120])
            else:
                outcome[node] = ("passed", "")
    result = {}
    for t, nodes in chosen.items():
        if not nodes:
            result[t] = ("no such test", "the table names a test the suite does not have")
            continue
        seen = [outcome.get(n, ("failed", "did not run")) for n in nodes]
        kinds = {s for s, _ in seen}
        state = "failed" if "failed" in kinds else "passed" if "passed" in kinds else "skipped"
        result[t] = (state, "; ".join(d for s, d in seen if s == state and d))
    return result


# ------------------------------------------------------------------------------------------------ the commands

class Scratch:
    def __init__(self, work: Path) -> None:
        self.work = work
        self._run: Path | None = None
        self._m1: Path | None = None

    def recurlen(self, argv: list[str], cwd: Path | None = None,
                 extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RECURLEN_FAULT", "RANK", "LOCAL_RANK"))}
        env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", RECURLEN_CACHE=str(self.work / "cache"),
                   **(extra_env or {}))
        argv = [*argv, *([f"data.cache_dir={self.work / 'cache'}"] if argv[0] == "finetune" else [])]
        return subprocess.run([sys.executable, "-m", "recurlen", *argv], cwd=cwd or self.work, env=env,
                              capture_output=True, text=True, timeout=1200)

    @property
    def run(self) -> Path:
        if self._run is None:
            self._run = self._train("RUN")
        return self._run

    @property
    def m1run(self) -> Path:
        if self._m1 is None:
            self._m1 = self._train("M1RUN", "model=mamba1-nano")
        return self._m1

    def _train(self, name: str, *extra: str) -> Path:
        out = self.work / name
        print(f"training {name} (finetune $B $C {' '.join(extra)}) ...", flush=True)
        proc = self.recurlen([*FINETUNE, *extra, f"run_dir={out}"])
        if proc.returncode != 0:
            raise SystemExit(f"the reference run {name} failed: {proc.stderr[-2000:]}")
        return out


def digests(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file()}


def same_weights(a: Path, b: Path) -> bool:
    import torch

    x = torch.load(a / "checkpoints" / "last.ckpt", weights_only=True)
    y = torch.load(b / "checkpoints" / "last.ckpt", weights_only=True)
    return x["global_step"] == y["global_step"] and all(torch.equal(x["state_dict"][k], v)
                                                        for k, v in y["state_dict"].items())


def setup(kind: str, s: Scratch, d: Path) -> None:
    if kind == "plant_mamba1":  # #36: a mamba1-nano last.ckpt put into a copy of RUN
        shutil.copytree(s.run, d)
        shutil.copy(s.m1run / "checkpoints" / "last.ckpt", d / "checkpoints" / "last.ckpt")
    elif kind == "copy_run":
        shutil.copytree(s.run, d)
    elif kind == "config_only":  # #90: config.yaml, an empty checkpoints/
        (d / "checkpoints").mkdir(parents=True)
        shutil.copy(s.run / "config.yaml", d / "config.yaml")
    elif kind == "half_json":
        text = (s.work / "e88" / "results.json").read_text() if (s.work / "e88" / "results.json").is_file() else \
            json.dumps({"format": "recurlen.eval/1", "runs": [{"label": "x"}] * 50}, indent=2)
        (s.work / "half.json").write_text(text[: len(text) // 2])
    elif kind == "list_json":
        (s.work / "list.json").write_text("[1, 2, 3]")
    elif kind == "mkdir_pq":
        (s.work / "p" / "q").mkdir(parents=True, exist_ok=True)
    elif kind == "big_jsonl":  # #213, #214: 8,000 rows (~2.4 MB), dozens of the token cache's chunks
        write_jsonl(s.work / "big.jsonl", [{"text": f"doc {i}: " + " ".join(["state", "lane", "scan"][j % 3]
                                                                           for j in range(20 + i % 60))}
                                           for i in range(8000)])
    elif kind == "mixed_jsonl":  # #215: 400 rows, every tenth without "text", row 5 a null text, row 7 an empty one
        rows = [{"text": f"doc {i}: " + "the state of a lane " * 8} if i % 10 else {"title": f"no text {i}"}
                for i in range(400)]
        rows[5], rows[7] = {"text": None}, {"text": ""}
        write_jsonl(s.work / "mixed.jsonl", rows)
    elif kind == "bad_data":  # #216-#218: all-empty documents, a text file named .jsonl.zst, a damaged .jsonl.zst
        write_jsonl(s.work / "empty.jsonl", [{"text": ""}] * 40)
        (s.work / "text.jsonl.zst").write_text('{"text": "hello"}\n' * 40)
        (s.work / "damaged.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 2)
    elif kind == "a_file":  # #221: --out under a file
        (s.work / "a-file").write_text("x")
    elif kind == "export_run":  # #201: RUN exported on its own, without a card
        proc = s.recurlen(["export", str(s.run), "--out", str(d / "export"), "card=false"])
        if proc.returncode != 0:
            raise SystemExit(f"exporting RUN failed: {proc.stderr[-2000:]}")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    if not path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def fill(text: str, s: Scratch, d: Path) -> str:
    for key, value in (("{RUN}", lambda: str(s.run)), ("{M1RUN}", lambda: str(s.m1run)), ("{D}", lambda: str(d)),
                       ("{W}", lambda: str(s.work))):
        if key in text:
            text = text.replace(key, value())
    return text


def quoted_pieces(row: Row, places: dict[str, str]) -> list[str]:
    """The pieces of the row's first quote (later quotes tell variants of the case or what happened before)."""
    pieces = []
    for quote in row.quotes()[:1]:
        for piece in quote.split("…"):
            piece = piece.strip(" ;,")
            for name, value in sorted(places.items(), key=lambda kv: -len(kv[0])):
                piece = re.sub(rf"(?<![\w/.-]){re.escape(name)}(?![\w])", lambda _m, v=value: v, piece)
            if len(piece) >= 3:
                pieces.append(piece)
    return pieces


def check_command(row: Row, spec: dict, s: Scratch) -> tuple[bool, str, str]:
    """(same, documented, observed) of running the row's command."""
    d = s.work / f"D{row.number}"
    if spec.get("needs") and not (s.work / "e88").exists():
        check_command(ROWS_BY_NUMBER[spec["needs"]], COMMANDS[spec["needs"]], s)
    if spec.get("setup"):
        setup(spec["setup"], s, d)
    untouched = spec.get("untouched")
    watched = Path(fill(untouched, s, d)) if isinstance(untouched, str) else s.run if untouched else None
    before = digests(watched) if watched else None
    cwd = Path(fill(spec["cwd"], s, d)) if spec.get("cwd") else None
    if cwd:
        cwd.mkdir(parents=True, exist_ok=True)
    proc = s.recurlen([fill(a, s, d) for a in spec["argv"]], cwd=cwd, extra_env=spec.get("env"))
    output = proc.stdout + proc.stderr
    stated = re.search(r"\bexit (\d+)", row.outcome)
    want_code = int(stated.group(1)) if stated else CLASSES[row.klass]
    places = {"RUN": str(s.run), "D": str(d), "xc": str(s.work / "xc"), "DIR": str(d)}
    places.update({k: fill(v, s, d) for k, v in spec.get("places", {}).items()})
    missing = [p for p in quoted_pieces(row, places) if p not in output]
    problems = []
    if want_code is not None and proc.returncode != want_code:
        problems.append(f"exit {proc.returncode}, documented {want_code}")
    problems += [f"not said: {p!r}" for p in missing]
    if "Traceback" in output:
        problems.append("a traceback")
    if before is not None and digests(watched) != before:
        problems.append(f"{watched} changed")
    if spec.get("absent") and Path(fill(spec["absent"], s, d)).exists():
        problems.append(f"{fill(spec['absent'], s, d)} was created")
    if spec.get("present") and not Path(fill(spec["present"], s, d)).exists():
        problems.append(f"{fill(spec['present'], s, d)} was not written")
    if spec.get("weights"):
        target = Path(fill(spec["weights"], s, d))
        if not (target / "checkpoints" / "last.ckpt").is_file() or not same_weights(target, s.run):
            problems.append("not bitwise equal to RUN")
    if spec.get("advice") and not problems:  # the printed command, run as printed (but for the interpreter)
        advised = shlex.split(output.split("): recurlen ", 1)[1].splitlines()[0])
        again = s.recurlen(advised)
        target = Path(fill(spec["advice"], s, d))
        if again.returncode != 0:
            problems.append(f"the advice exits {again.returncode}: {again.stderr[-300:]}")
        elif "bitwise" in row.outcome and not same_weights(target, s.run):
            problems.append("the advice's run is not bitwise equal to RUN")
    said = [line for line in output.splitlines() if line.startswith("recurlen ") and ": " in line]
    observed = f"exit {proc.returncode}" + (f', "{said[-1]}"' if said else "")
    documented = f"{row.klass}, exit {want_code}" if want_code is not None else row.klass
    return not problems, documented, observed + ("" if not problems else "  DIFFERS: " + "; ".join(problems))


ROWS_BY_NUMBER: dict[str, Row] = {}


def wanted(rows: list[Row], spec: str | None) -> list[Row]:
    if not spec:
        return rows
    keep: set[str] = set()
    for part in spec.split(","):
        if "-" in part:
            a, b = (int(x) for x in part.split("-"))
            keep |= {str(n) for n in range(a, b + 1)}
        keep.add(part)
    return [r for r in rows if r.number in keep or re.sub(r"[a-c]$", "", r.number) in keep]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", help="e.g. 36,43-51 (default: every row)")
    parser.add_argument("--no-tests", action="store_true", help="only the rows re-run as commands")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    rows = parse_table(TABLE.read_text())
    ROWS_BY_NUMBER.update({r.number: r for r in rows})
    rows = wanted(rows, args.rows)
    work = Path(tempfile.mkdtemp(prefix="fault-cases-"))
    scratch = Scratch(work)
    tests = {} if args.no_tests else run_tests(rows, work)
    counts = {"same": 0, "differs": 0, "not re-run": 0}
    try:
        for row in rows:
            lines, verdicts = [], []
            for t in row.tests if not args.no_tests else []:
                state, detail = tests[t]
                verdicts.append(state in ("passed", "skipped"))
                lines.append(f"    test {t}: {state}" + (f" ({detail})" if detail and state != "passed" else ""))
            if row.number in COMMANDS:
                same, documented, observed = check_command(row, COMMANDS[row.number], scratch)
                verdicts.append(same)
                lines.append(f"    documented: {documented}: {row.outcome[:160]}")
                lines.append(f"    observed:   {observed}")
            ran = bool(lines) and not all(line.endswith("skipped") or ": skipped (" in line for line in lines)
            if not ran:
                verdict = "not re-run"
                reason = row.evidence if not lines else "its tests were skipped here"
                lines.append(f"    ({reason[:160]})")
            else:
                verdict = "same" if all(verdicts) else "differs"
            counts[verdict] += 1
            print(f"#{row.number} {row.case} [{row.klass}]: {verdict.upper()}", flush=True)
            print("\n".join(lines), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(rows)} rows: {counts['same']} as documented, {counts['differs']} differ, "
          f"{counts['not re-run']} not re-run")
    return 1 if counts["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
