"""Every command line of the README and every target of `make help` runs as written.

Lines are read from the README's ```bash blocks (continuations joined, comments dropped, `for` loops
expanded); `make` lines go through `make -n` so the Makefile's own composition of the command is tested.
CPU-sized commands (the demo, fine-tuning, fit-noise, eval, report, generate, lint, TensorBoard) run for
real in a scratch directory with tiny overrides appended (later key=value settings win); GPU and hub
commands run with `--dry-run`, which composes and validates everything and resolves every path without
loading or downloading. The test fails when a documented line stops parsing, names an unknown key or a
missing file, or when a command listed below as run for real disappears from the README.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from recurlen import cli

ROOT = Path(__file__).resolve().parents[1]
TRAIN_TINY = ["trainer.max_steps=2", "data.max_documents=60", "data.val_fraction=0.2", "data.val_length=128",
              "data.val_sequences=2",
              "trainer.val_every_n_steps=0", "trainer.checkpoint_every_n_steps=0", "trainer.progress_bar=false",
              "trainer.limit_val_batches=1", "diagnostics.effrem=false", "intervention.fit_batches=2"]
EVAL_TINY = ["seq_len=128", "num_sequences=2", "tasks=[positionwise,reset,state]", "log_bins=4", "batch_size=2",
             "chunk_len=64", "progress=false"]
DEMO_TINY = ["pretrain_steps=3", "posttrain_steps=2", "interventions=[tbptt]",
             "overrides=[data.max_documents=60,data.val_fraction=0.2,data.val_length=128,data.val_sequences=2,trainer.val_every_n_steps=0,"
             "trainer.checkpoint_every_n_steps=0,trainer.limit_val_batches=1,diagnostics.effrem=false]",
             "eval.length=128", "eval.num_sequences=2", "eval.effrem=false", "eval.chunk_len=64", "eval.batch_size=2"]
# README lines (as written, comments dropped) that run for real, with what makes them tiny.
REAL = {
    "make demo": DEMO_TINY,
    "make finetune": TRAIN_TINY,
    "recurlen config model=780m intervention=tbptt": [],
    "recurlen eval base=runs/demo/pretrain tbptt=runs/demo/post/tbptt --out runs/eval seq_len=1024 "
    "num_sequences=64": EVAL_TINY,
    "recurlen report runs/eval/results.json --out runs/eval": [],
    "make eval ARGS='seq_len=512 num_sequences=16'": EVAL_TINY,
    "make tensorboard": [],
}
# Targets of `make help` that run for real when no README line runs them (default variables).
REAL_TARGETS = {"fit-noise": TRAIN_TINY, "generate": ["max_new_tokens=4"], "help": [], "lint": []}


def readme_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        loop: tuple[str, list[str]] | None = None
        for raw in joined.splitlines():
            line = strip_comment(raw)
            match = re.match(r"for (\w+) in (.*?); do$", line)
            if match:
                loop, body = (match.group(1), match.group(2).split()), []
                continue
            if loop is not None and line == "done":
                var, values = loop
                lines += [b.replace(f"${var}", v) for v in values for b in body]
                loop = None
            elif loop is not None and line:
                body.append(line)
            elif line:
                lines.append(line)
    return lines


def strip_comment(raw: str) -> str:
    """The line without its trailing `# comment` (a # outside quotes after a space), whitespace collapsed."""
    quote, out = None, []
    for i, ch in enumerate(raw):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or raw[i - 1].isspace()):
            break
        out.append(ch)
    return " ".join("".join(out).split())


LINES = readme_lines()


def make_targets() -> list[str]:
    proc = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    return [m.group(1) for m in re.finditer(r"^  ([a-z][a-z-]*)\s", plain, flags=re.M)]


def make_commands(words: list[str]) -> list[list[str]]:
    """The shell commands `make -n` would run for a make line, each split into words."""
    proc = subprocess.run(["make", "-n", *words], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"make -n {' '.join(words)}: {proc.stderr}"
    return [shlex.split(line) for line in proc.stdout.splitlines()
            if line.strip() and not line.startswith(("make:", "make["))]  # make's own notes


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A scratch working directory in which the README's runs land (runs/...), built by the tiny demo."""
    root = tmp_path_factory.mktemp("readme")
    env = {"RECURLEN_EXPERIMENTS": str(ROOT / "experiments"), "RECURLEN_CACHE": str(root / "cache"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def recurlen(argv: list[str], *, real: list[str] | None) -> None:
    """Run `recurlen argv` in-process: for real with `real` appended, else with --dry-run."""
    full = [*argv, *real] if real is not None else [*argv, "--dry-run"]
    rc = cli.main(full)
    assert rc == 0, f"recurlen {' '.join(full)} exited {rc}"


def more_demo_runs(world: Path) -> None:
    """The tiny demo post-trains tbptt only (time); `make eval`'s default RUNS also name none and
    state_passing, which get copies of it."""
    for name in ("none", "state_passing"):
        target = world / "runs" / "demo" / "post" / name
        if not target.exists():
            shutil.copytree(world / "runs" / "demo" / "post" / "tbptt", target)


def fake_gpu_runs(world: Path) -> None:
    """What the README's GPU fine-tunings would leave (copies of the tiny demo's runs), so that the commands
    that read them resolve real run directories."""
    for name in ("none", "fitted_noise", "state_passing", "tbptt"):
        target = world / "runs" / "finetune" / f"780m-{name}"
        if not target.exists():
            shutil.copytree(world / "runs" / "demo" / "post" / "tbptt", target)
    results = world / "runs" / "eval780m" / "results.json"
    if not results.exists():
        results.parent.mkdir(parents=True)
        shutil.copy(world / "runs" / "demo" / "eval" / "results.json", results)


def run_line(line: str, world: Path) -> str:
    """Run one README line; returns how ('real', 'dry-run', 'make -n', ...)."""
    real = REAL.get(line)
    words = shlex.split(line)
    env_prefix = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, value = words.pop(0).split("=", 1)
        env_prefix[key] = value
    head = words[0]
    if head == "recurlen":
        recurlen(words[1:], real=real)
        return "real" if real is not None else "dry-run"
    if head == "torchrun":
        recurlen(words[words.index("recurlen.cli") + 1:], real=None)
        return "dry-run"
    if head == "sbatch":
        script = next(w for w in words if w.endswith(".sbatch"))
        args = words[words.index(script) + 1:]
        env = {**os.environ, **env_prefix, "SLURM_JOB_NUM_NODES": "2"}
        proc = subprocess.run(["bash", "-c", f'srun() {{ "$@" --dry-run; }}; cd {shlex.quote(str(ROOT))}; '
                               f'source {script} "$@"', "_", *args], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and "dry run: everything resolved" in proc.stdout, proc.stderr[-2000:]
        return "dry-run (script)"
    if head == "make":
        return run_make(words[1:], world, real)
    raise AssertionError(f"README command line not understood by this test: {line}")


def run_make(words: list[str], world: Path, real: list[str] | None) -> str:
    target = next((w for w in words if "=" not in w), "help")
    how = set()
    for cmd in make_commands(words):
        if "recurlen.cli" in cmd:
            argv = cmd[cmd.index("recurlen.cli") + 1:]
            if argv[0] == "report" or real is not None:
                recurlen(argv, real=real if argv[0] != "report" else [])
                how.add("real")
            else:
                recurlen(argv, real=None)
                how.add("dry-run")
        elif "pytest" in cmd:
            out = subprocess.run([*cmd, "--collect-only", "-q"], cwd=ROOT, capture_output=True, text=True,
                                 timeout=300)
            assert out.returncode == 0, out.stdout[-2000:]
            how.add("collect-only")
        elif "ruff" in cmd:
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout[-2000:]
            how.add("real")
        elif cmd[0].endswith("tensorboard"):
            serve_tensorboard(cmd, world)
            how.add("served")
        elif any(w.startswith("benchmarks/") or "benchmarks/" in w for w in cmd):
            scripts = sorted(set(re.findall(r"benchmarks/bench_\w+\.py", " ".join(cmd))))
            if "$b" in " ".join(cmd) or "for" in cmd:
                scripts = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "benchmarks").glob("bench_*.py"))
                           if p.name != "bench_gpu.py"]
            for script in scripts:
                out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                                     timeout=300)
                assert out.returncode == 0, f"{script} --help: {out.stderr[-1000:]}"
            how.add("--help")
        elif cmd[0] in ("test", "touch") or "pip" in cmd or "venv" in cmd or cmd[0] == "awk" or cmd[0] == "echo":
            if target == "help":
                out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
                assert out.returncode == 0 and "finetune" in out.stdout
                how.add("real")
            else:
                how.add("make -n")
        else:
            raise AssertionError(f"`make {' '.join(words)}` runs {cmd!r}, which this test does not know")
    return "+".join(sorted(how)) or "make -n"


def serve_tensorboard(cmd: list[str], world: Path) -> None:
    """Start the command as written (plus a free local port), wait until its HTTP API answers, stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = cmd[0] if os.path.isabs(cmd[0]) else str(ROOT / cmd[0])
    proc = subprocess.Popen([exe, *cmd[1:], "--host", "127.0.0.1", "--port", str(port)], cwd=world,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as resp:
                    runs = resp.read().decode()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()[-2000:]
                assert time.time() < deadline, "tensorboard did not answer within 120 s"
                time.sleep(1)
        assert "demo/pretrain/tb" in runs, runs
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_readme_has_the_commands_this_test_runs_for_real():
    missing = sorted(set(REAL) - set(LINES))
    assert missing == [], f"README lines run for real by this test are gone (update REAL): {missing}"
    assert len(LINES) >= 25


@pytest.mark.slow  # ~16 min on a loaded 2-core machine (tiny demo, real runs, make -n of every target)
def test_every_readme_line_and_make_target_runs(world):
    ran: dict[str, str] = {}
    # The demo first: its runs are what the later lines evaluate and report on.
    ordered = sorted(LINES, key=lambda line: line != "make demo")
    for line in ordered:
        if line.startswith(("recurlen report runs/eval780m", "recurlen eval base=state-spaces")):
            fake_gpu_runs(world)
        if line.startswith("make eval"):
            more_demo_runs(world)
        if line in ("make test", "make install", "make install EXTRAS=dev,cuda TORCH_CPU=torch"):
            ran[line] = run_make(shlex.split(line)[1:], world, None)
            continue
        ran[line] = run_line(line, world)
    covered = {next((w for w in shlex.split(line)[1:] if "=" not in w), "help")
               for line in LINES if line.startswith("make")}
    for target in make_targets():
        if target not in covered:
            ran[f"make {target}"] = run_make([target], world, REAL_TARGETS.get(target))
    assert set(make_targets()) <= covered | {t for t in (k.split()[1] for k in ran if k.startswith("make "))}
    assert (world / "runs" / "demo" / "report.md").is_file()
    assert (world / "runs" / "eval" / "report.md").is_file() and (world / "runs" / "eval" / "results.json").is_file()
    sys.stdout.write("\n".join(f"{how:18s} {line}" for line, how in ran.items()) + "\n")
