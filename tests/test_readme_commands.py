"""Every command line of the README and of the pages in docs/, and every target of `make help`, runs as written.

Lines are read from the ```bash blocks of README.md and then of docs/*.md (continuations joined, comments dropped,
`for` loops expanded; a line documented twice is tested once); `make` lines go through `make -n`, so the
Makefile's own composition of the command is what runs.
One tiny demo (the README's `make demo` with tiny overrides, a module fixture) leaves the runs the other
lines read. Then each line is one test:
  - CPU-sized commands (fine-tuning, fit-noise, eval, report, config, generate, lint, help, TensorBoard) run
    for real in-process, tiny overrides appended (later key=value settings win);
  - GPU and hub commands (and the long-context tasks, whose real runs take minutes) run with `--dry-run`,
    which composes and validates everything and resolves every path without loading or downloading;
  - the SLURM script runs with `srun` standing in to hand its command line to the same dry run; torchrun's
    options go through torchrun's own parser; the `make test*` targets are collected (`--collect-only`) and
    the benchmark scripts' command lines parsed by their own argparse (one process each for all of them);
  - Hugging Face Hub lines (`hf download ...`, fetched on a machine with network) run the real `hf` with
    HF_HUB_OFFLINE=1 and an empty HF_HOME: its own parser must accept them (a usage error exits 2) and it must
    get as far as the hub, which offline mode refuses; `export` lines must be plain NAME=value assignments.
A line fails when it stops parsing, names an unknown key, value or missing file, when a make target is gone,
or when a command listed below as run for real disappears from the documentation; test_a_broken_line_fails checks
that such breaks are caught. The long-context tasks run for real (tiny) in the slow tier.
"""

from __future__ import annotations

import json
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

from recurlen.commands import cli

ROOT = Path(__file__).resolve().parents[1]
TRAIN_TINY = ["trainer.max_steps=2", "data.max_documents=60", "data.val_fraction=0.2", "data.val_length=128",
              "data.val_sequences=2", "trainer.val_every_n_steps=0", "trainer.checkpoint_every_n_steps=0",
              "trainer.progress_bar=false", "trainer.limit_val_batches=1", "diagnostics.effrem=false",
              "intervention.fit_batches=2"]
EVAL_TINY = ["seq_len=128", "num_sequences=2", "tasks=[positionwise,reset,state]", "log_bins=4", "batch_size=2",
             "chunk_len=64", "progress=false"]
DEMO_TINY = ["pretrain_steps=3", "posttrain_steps=2", "interventions=[tbptt]", "parallel=1",
             "overrides=[data.max_documents=60,data.val_fraction=0.2,data.val_length=128,data.val_sequences=2,"
             "trainer.val_every_n_steps=0,trainer.checkpoint_every_n_steps=0,trainer.limit_val_batches=1,"
             "diagnostics.effrem=false,diagnostics.positionwise=false,diagnostics.state_norm=false]",
             "eval.length=128", "eval.num_sequences=2", "eval.effrem=false", "eval.chunk_len=64", "eval.batch_size=2"]
# Documented lines (README or docs/, as written, comments dropped) that run for real, with what makes them tiny.
REAL = {
    "make demo": DEMO_TINY,
    "make finetune": TRAIN_TINY,
    "make finetune MODEL=mamba1-tiny STEPS=20": TRAIN_TINY,
    "recurlen config model=780m intervention=tbptt": [],
    "recurlen eval base=runs/demo/pretrain tbptt=runs/demo/post/tbptt --out runs/eval seq_len=1024 "
    "num_sequences=64": EVAL_TINY,
    "recurlen report runs/eval/results.json --out runs/eval": [],
    "recurlen report runs/eval780m/results.json --out runs/eval780m": [],
    "make eval ARGS='seq_len=512 num_sequences=16'": EVAL_TINY,
    # Fitted noise with the refresh, from the demo's base: the run, then its evaluation (which needs the run).
    "recurlen finetune experiment=demo-posttrain intervention=fitted_noise intervention.fit_refresh=ema "
    "model.pretrained=runs/demo/pretrain/checkpoints/last.ckpt run_dir=runs/refresh/fitted_noise-ema "
    "trainer.num_threads=1": [*TRAIN_TINY, "intervention.fit_refresh_every=1"],
    "recurlen eval base=runs/demo/pretrain fitted_noise_ema=runs/refresh/fitted_noise-ema seq_len=1024 "
    "num_sequences=64 chunk_len=256 batch_size=16 tasks=[positionwise,reset,state] --out runs/refresh/eval": EVAL_TINY,
    # The steps-to-hold curve validated every 50 steps: each post-training, then their evaluation and report.
    **{f"recurlen finetune experiment=demo-posttrain intervention={i} model.pretrained=runs/demo/pretrain/checkpoints/"
       f"last.ckpt run_dir=runs/steps-curve/{i} trainer.num_threads=1 trainer.val_every_n_steps=50": TRAIN_TINY
       for i in ("state_passing", "tbptt")},
    "recurlen eval state_passing=runs/steps-curve/state_passing tbptt=runs/steps-curve/tbptt seq_len=1024 "
    "num_sequences=16 tasks=[positionwise,reset] --out runs/steps-curve/eval": EVAL_TINY,
    "recurlen report runs/steps-curve/eval --out runs/steps-curve": [],
    "make tensorboard": [],
    # docs/data.md's worked example: its own held-out settings, as written, on the folder of .txt files.
    "recurlen finetune data.source=data/my-corpus data.val_fraction=0.1 data.val_mode=windows data.val_sequences=8 "
    "run_dir=runs/finetune/my-corpus": ["trainer.max_steps=2", "trainer.val_every_n_steps=0",
                                        "trainer.checkpoint_every_n_steps=0", "trainer.progress_bar=false",
                                        "trainer.limit_val_batches=1", "diagnostics.positionwise=false",
                                        "diagnostics.state_norm=false", "trainer.num_threads=1"],
    "make lint": [],
    "make export RUN=runs/demo/post/state_passing FORMAT=official": [],
}
# Targets of `make help` that run for real when no documented line runs them (default variables).
REAL_TARGETS = {"fit-noise": TRAIN_TINY, "generate": ["max_new_tokens=4"], "help": []}
# The long-context tasks for real, tiny (slow tier): their documented lines, and what makes them tiny.
_TASK_RUN = ["trainer.max_steps=2", "trainer.val_every_n_steps=0", "trainer.checkpoint_every_n_steps=0",
             "trainer.limit_val_batches=1", "trainer.progress_bar=false", "data.max_documents=60",
             "data.val_fraction=0.2", "data.batch_size=4", "task.trials=1", "task.eval_batch_size=2"]
TASK_TINY = {
    "make passkey": [*_TASK_RUN, "intervention.fit_batches=2", "task.lengths=[256,512]"],
    "make babilong": [*_TASK_RUN, "intervention.fit_batches=2", "task.lengths=[256,512]", "task.babilong.tasks=[qa1]"],
    "make copying": [*_TASK_RUN, "task.copying.seeds=[0]", "task.copying.parallel=1"],
    "make niah": [*_TASK_RUN, "intervention.fit_batches=2", "task.lengths=[512]", "task.niah.depths=[0.5]"],
}


# Where the documented lines are read from: the README first, then every page of docs/.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Files that lines documented for GPU clusters read, made empty in the scratch directory so that their dry runs
# resolve them (the GPU quickstart's Pile files, fetched with `hf download ... --local-dir data/pile`).
DATA_STAND_INS = ["data/pile/train/00.jsonl.zst", "data/pile/val.jsonl.zst"]


def doc_lines() -> dict[str, str]:
    """Every documented command line in order, each once, with the file it is first documented in."""
    found: dict[str, str] = {}
    for path in DOCS:
        for line in bash_lines(path.read_text()):
            found.setdefault(line, path.relative_to(ROOT).as_posix())
    return found


def bash_lines(text: str) -> list[str]:
    """The command lines of a Markdown text's ```bash blocks, in order."""
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
    return list(dict.fromkeys(lines))


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


SOURCES = doc_lines()
LINES = list(SOURCES)


def make_targets() -> list[str]:
    proc = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    return [m.group(1) for m in re.finditer(r"^  ([a-z][a-z-]*)\s", plain, flags=re.M)]


TARGETS = make_targets()


def target_of(words: list[str]) -> str:
    return next((w for w in words if "=" not in w), "help")


def uncovered_targets() -> list[str]:
    covered = {target_of(shlex.split(line)[1:]) for line in LINES if line.startswith("make")}
    return [t for t in TARGETS if t not in covered]


def make_commands(words: list[str], world: Path | None = None) -> list[list[str]]:
    """The shell commands `make -n` would run for a make line, each split into words. With a world, the demos
    whose runs `make finetune MODEL=tiny` and `make eval` pick are looked for there (DEMO_ROOTS), not in the
    checkout's runs/."""
    roots = [f"DEMO_ROOTS={world / 'runs' / 'demo'} {world / 'runs' / 'demo-quick'}"] if world is not None else []
    proc = subprocess.run(["make", "-n", *words, *roots], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"make -n {' '.join(words)}: {proc.stderr}"
    joined = re.sub(r"\\\n\s*", " ", proc.stdout)  # a recipe line continued with a backslash is one command
    return [shlex.split(line) for line in joined.splitlines()
            if line.strip() and not line.startswith(("make:", "make["))]  # make's own notes


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading VAR=value words (a shell's per-command environment) and the command after them."""
    env, i = {}, 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        key, value = words[i].split("=", 1)
        env[key] = value
        i += 1
    return env, words[i:]


class Checks:
    """Checks that need a Python process of their own, batched into one process (torch and the test suite are
    imported once, not once per line): `pytest ... --collect-only` for the make targets that run pytest, and
    the benchmark scripts' command lines through their own argparse. `start` runs the checks every documented
    line needs in the background (while the tiny demo trains); a command not started there runs on demand."""

    def __init__(self) -> None:
        self.results: dict[str, dict] = {}
        self.pending: subprocess.Popen | None = None
        self.pending_jobs: list[list] = []

    def start(self, jobs: list[list]) -> None:
        """jobs: [kind, command] with kind "collect" or "parse"."""
        self.pending_jobs = [j for j in dict((json.dumps(j), j) for j in jobs).values()]
        self.pending = self._spawn(self.pending_jobs)

    def result(self, kind: str, cmd: list[str]) -> dict:
        key = json.dumps([kind, cmd])
        if key not in self.results and self.pending is not None and [kind, cmd] in self.pending_jobs:
            self._finish(self.pending, self.pending_jobs)
            self.pending = None
        if key not in self.results:
            self._finish(self._spawn([[kind, cmd]]), [[kind, cmd]])
        return self.results[key]

    @staticmethod
    def _spawn(jobs: list[list]) -> subprocess.Popen:
        # Collections first: the parse checks patch argparse, which pytest's own command line uses too.
        jobs = sorted(jobs, key=lambda j: j[0] != "collect")
        path = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])
        return subprocess.Popen([sys.executable, "-c", HELPER, json.dumps(jobs)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path})

    def _finish(self, proc: subprocess.Popen, jobs: list[list]) -> None:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        jobs = sorted(jobs, key=lambda j: j[0] != "collect")
        for job, result in zip(jobs, json.loads(out.splitlines()[-1])):
            self.results[json.dumps(job)] = result


# The batched checks' process. collect: `pytest ... --collect-only -q` in-process, one call per command line.
# parse: a benchmark script's command line through its own argparse, stopped right after parsing.
HELPER = r"""
import argparse, contextlib, io, json, os, runpy, sys
jobs = json.loads(sys.argv[1])
original = argparse.ArgumentParser.parse_args
class Parsed(Exception):
    pass
def parse_only(self, args=None, namespace=None):
    original(self, args, namespace)  # exits 2 with argparse's message on a bad command line
    raise Parsed
out = []
for kind, cmd in jobs:
    env = {}
    while cmd and "=" in cmd[0] and not cmd[0].startswith("-"):
        key, value = cmd.pop(0).split("=", 1)
        env[key] = value
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            if kind == "collect":
                import pytest
                args = cmd[cmd.index("pytest") + 1:]
                code = int(pytest.main([*args, "--collect-only", "-q", "-p", "no:cacheprovider"]))
            else:
                argparse.ArgumentParser.parse_args = parse_only
                script = next(w for w in cmd if w.endswith(".py"))
                sys.argv = cmd[cmd.index(script):]
                try:
                    runpy.run_path(script, run_name="__main__")
                    code = "ran without parsing arguments"
                except Parsed:
                    code = 0
                except SystemExit as err:
                    code = err.code
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    out.append({"code": code, "output": buf.getvalue()[-3000:]})
sys.stdout.write("\n" + json.dumps(out) + "\n")
"""


def planned_checks() -> list[list]:
    """The batched checks that the documented make lines and the other make targets will ask for."""
    jobs = []
    for words in [shlex.split(line)[1:] for line in LINES if line.startswith("make ")] + [[t] for t in TARGETS]:
        for cmd in make_commands(words):
            env, bare = split_env(cmd)
            if "pytest" in bare:
                jobs.append(["collect", cmd])
            elif bare[:1] == ["for"]:
                jobs += [["parse", c] for c in bench_loop(bare)]
            elif any(re.search(r"benchmarks/\w+\.py$", w) for w in bare):
                jobs.append(["parse", cmd])
            elif bare[:1] == ["bash"] and bare[1].endswith(".sh"):
                jobs.append(["parse", gpu_check_command(bare, env)])
    return jobs


def bench_loop(cmd: list[str]) -> list[list[str]]:
    """`make bench`'s shell loop as one command line per script."""
    loop = " ".join(cmd)
    scripts = re.search(r"for b in (.*?); do", loop).group(1).split()
    options = shlex.split(re.search(r"\$\$?b (.*?) \|\|", loop).group(1))
    return [[sys.executable, script, *options] for script in scripts]


def gpu_check_command(cmd: list[str], env: dict[str, str]) -> list[str]:
    """The Python command line the GPU check script ends with."""
    final = re.search(r'^exec "\$PY" (\S+\.py) \$\{ARGS:-\}$', (ROOT / cmd[1]).read_text(), flags=re.M)
    assert final, f"{cmd[1]} no longer ends by running its Python check"
    return [sys.executable, final.group(1), *shlex.split(env.get("ARGS", ""))]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A scratch working directory in which the documented runs land (runs/...), offline, with its own cache."""
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


@pytest.fixture(scope="module")
def world(scratch):
    """The scratch directory with the tiny demo's runs (the README's `make demo`) and copies of them where
    other lines expect runs that take GPUs to make."""
    world = World(scratch)
    world.checks.start(planned_checks())  # in the background, while the demo trains
    world.demo_how = run_line("make demo", scratch, world.checks)
    stand_ins(scratch)
    return world


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.checks = Checks()
        self.demo_how = ""


def stand_ins(world: Path) -> None:
    """Copies of the tiny demo's tbptt run where lines read runs made on GPUs or by other demo settings:
    the full demo's post-trainings (`make eval`'s default RUNS, the model card's Reproduce lines), the documented
    780m fine-tunings, results to report, and empty stand-ins for the data files that GPU lines read
    (DATA_STAND_INS)."""
    post = world / "runs" / "demo" / "post"
    targets = [post / name for name in ("none", "random_noise", "fitted_noise", "state_passing")]
    targets += [world / "runs" / "finetune" / f"780m-{name}" for name in ("none", "fitted_noise", "state_passing",
                                                                          "tbptt")]
    for target in targets:
        if not target.exists():
            shutil.copytree(post / "tbptt", target)
            if target.parent.name == "finetune":
                # The 780m lines' dry runs see these directories too: with the tiny run's config.yaml they would
                # (rightly) refuse to resume a run of another model; the evaluations read only the checkpoint.
                (target / "config.yaml").unlink(missing_ok=True)
    # The Mamba-1 quick demo's base and post-trainings, which docs/evaluation.md's Mamba-1 comparison reads (its
    # lines dry-run, so the tiny demo's checkpoints stand in: only the paths must resolve).
    mamba1 = world / "runs" / "demo-mamba1-quick"
    for source, target in [(world / "runs" / "demo" / "pretrain", mamba1 / "pretrain"),
                           *((post / "tbptt", mamba1 / "post" / name) for name in ("none", "state_passing", "tbptt"))]:
        if not target.exists():
            shutil.copytree(source, target)
    for name in DATA_STAND_INS:
        (world / name).parent.mkdir(parents=True, exist_ok=True)
        (world / name).touch()
    # docs/data.md's corpus (its first line writes it), so that its training lines also run on their own (-k data).
    subprocess.run([sys.executable, str(ROOT / "scripts" / "example_corpus.py"), str(world / "data" / "my-corpus")],
                   check=True, capture_output=True, timeout=120)
    for out in ("eval", "eval780m"):  # so that a report line runs on its own too (-k report)
        results = world / "runs" / out / "results.json"
        if not results.exists():
            results.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(world / "runs" / "demo" / "eval" / "results.json", results)


def recurlen(argv: list[str], *, real: list[str] | None) -> None:
    """Run `recurlen argv` in-process: for real with `real` appended, else with --dry-run."""
    full = [*argv, *real] if real is not None else [*argv, "--dry-run"]
    rc = cli.main(full)
    assert rc == 0, f"recurlen {' '.join(full)} exited {rc}"


def run_line(line: str, world: Path, checks: Checks, real: list[str] | None = None) -> str:
    """Run one documented line; returns how ('real', 'dry-run', 'make -n', ...)."""
    real = REAL.get(line) if real is None else real
    env_prefix, words = split_env(shlex.split(line))
    head = words[0]
    if head == "recurlen":
        recurlen(words[1:], real=real)
        return "real" if real is not None else "dry-run"
    if head == "torchrun":
        from torch.distributed.run import get_args_parser

        at = words.index("-m")
        values = {"$NODE_RANK": "0", "$MASTER": "127.0.0.1"}
        options = [re.sub(r"\$[A-Z_]+", lambda m: values[m.group(0)], w) for w in words[1:at]]
        parsed = get_args_parser().parse_args([*options, "-m", words[at + 1]])  # exits 2 on a bad option
        assert parsed.module and words[at + 1] == "recurlen", words
        recurlen(words[at + 2:], real=None)
        return "torchrun parse + dry-run"
    if head == "sbatch":
        return run_sbatch(words, env_prefix)
    if head == "make":
        return run_make(words[1:], world, checks, real)
    if head.endswith("python") and words[1:2] == ["scripts/example_corpus.py"]:  # docs/data.md's corpus, for real
        proc = subprocess.run([sys.executable, str(ROOT / words[1]), *words[2:]], cwd=world, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return "real"
    if head in ("hf", "huggingface-cli"):
        return run_hub_cli(words, world)
    if head == "export":
        bad = [w for w in words[1:] if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$", w)]
        assert words[1:] and not bad, f"`{line}`: not NAME=value assignments: {bad}"
        return "parsed"
    raise AssertionError(f"documented command line not understood by this test: {line}")


def run_hub_cli(words: list[str], world: Path) -> str:
    """A Hugging Face Hub command line (`hf download ...`, run on a machine with network), run by the real `hf`
    offline with an empty HF_HOME: its parser must accept it (exit 2 is a usage error) and it must get as far as
    the hub, which offline mode refuses. `huggingface-cli` is the same CLI's older name (huggingface_hub < 1.0);
    where only `hf` is installed, the line runs through `hf`. A local folder that an upload names is made empty."""
    exe = shutil.which(words[0], path=str(Path(sys.executable).parent)) or \
        shutil.which("hf", path=str(Path(sys.executable).parent)) or shutil.which("hf")
    assert exe, "huggingface_hub's `hf` command is not installed"
    cwd = world / "hub-cli"
    cwd.mkdir(exist_ok=True)
    positional = [w for w in words[2:] if not w.startswith("-")]
    if words[1:2] == ["upload"] and len(positional) >= 2:
        (cwd / positional[1]).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HOME": str(world / "hub-cli-home"), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    proc = subprocess.run([exe, *words[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    assert proc.returncode != 2, f"`{' '.join(words)}` is not a valid command line of `hf`:\n{out[-2000:]}"
    assert "offline mode is enabled" in out, f"`{' '.join(words)}` did not get as far as the hub:\n{out[-2000:]}"
    return "hub cli (offline)"


def run_sbatch(words: list[str], env_prefix: dict[str, str]) -> str:
    """The script as sbatch would run it, with `srun` handing its command line back instead of launching."""
    script = next(w for w in words if w.endswith(".sbatch"))
    options, args = words[1:words.index(script)], words[words.index(script) + 1:]
    text = (ROOT / script).read_text()
    nodes = next((o.split("=", 1)[1] for o in options if o.startswith("--nodes=")),
                 re.search(r"^#SBATCH --nodes=(\d+)", text, flags=re.M).group(1))
    env = {**os.environ, **env_prefix, "SLURM_JOB_NUM_NODES": nodes}
    proc = subprocess.run(["bash", "-c", f'srun() {{ printf "%s\\0" "$@"; }}; cd {shlex.quote(str(ROOT))}; '
                           f'source {script} "$@"', "_", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = proc.stdout.split("\0")[:-1]
    assert argv[1:3] == ["-m", "recurlen"], argv
    recurlen(argv[3:], real=None)
    return "dry-run (script)"


def run_make(words: list[str], world: Path, checks: Checks, real: list[str] | None) -> str:
    target = target_of(words)
    how = set()
    for raw in make_commands(words, world):
        env, cmd = split_env(raw)
        if "-m" in cmd and cmd[cmd.index("-m") + 1] == "recurlen":
            argv = cmd[cmd.index("-m") + 2:]
            if argv[0] == "report" or real is not None:
                recurlen(argv, real=real if argv[0] != "report" else [])
                how.add("real")
            else:
                recurlen(argv, real=None)
                how.add("dry-run")
        elif "pytest" in cmd:
            result = checks.result("collect", raw)
            assert result["code"] == 0, f"{' '.join(cmd)} --collect-only exited {result['code']}:\n{result['output']}"
            how.add("collect-only")
        elif "ruff" in cmd or "pylint" in cmd:  # make lint: both linters for real
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout[-2000:]
            how.add("real")
        elif cmd[0].endswith("tensorboard"):
            serve_tensorboard(cmd, world)
            how.add("served")
        elif cmd[:1] == ["for"]:  # make bench: every script with its options
            for c in bench_loop(cmd):
                assert checks.result("parse", c)["code"] == 0, f"{' '.join(c)}: {checks.result('parse', c)['output']}"
            how.add("parsed")
        elif any(re.search(r"benchmarks/\w+\.py$", w) for w in cmd):
            result = checks.result("parse", raw)
            assert result["code"] == 0, f"{' '.join(cmd)}: {result['code']}\n{result['output']}"
            how.add("parsed")
        elif any(w.endswith("scripts/fixes_table.py") for w in cmd):  # make fixes-table: each evaluation, dry-run
            proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fixes_table.py"), "--dry-run",
                                   *cmd[2:]], cwd=world, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            evals = [shlex.split(line)[1:] for line in proc.stdout.splitlines() if line.startswith("recurlen eval")]
            assert evals, f"make fixes-table planned no evaluation in the tiny demo's world:\n{proc.stdout}"
            for argv in evals:
                recurlen(argv, real=None)
            how.add("dry-run")
        elif cmd[:1] == ["bash"] and cmd[1].endswith(".sh"):  # make gpu-check
            run_gpu_check(cmd, env, checks)
            how.add("script")
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


def run_gpu_check(cmd: list[str], env: dict[str, str], checks: Checks) -> None:
    """The GPU check script: it must parse, and the command line it ends with must parse; without a GPU it
    runs for real and must stop at once, before installing anything, with exit 2 and a line saying why."""
    assert subprocess.run(["bash", "-n", str(ROOT / cmd[1])], capture_output=True).returncode == 0
    python = gpu_check_command(cmd, env)
    assert checks.result("parse", python)["code"] == 0, checks.result("parse", python)["output"]
    if shutil.which("nvidia-smi") is None:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert out.returncode == 2 and "no NVIDIA GPU found" in out.stderr, out.stderr[-1000:]


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
                time.sleep(0.5)
        assert "demo/pretrain/tb" in runs, runs
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_docs_have_the_commands_this_test_runs_for_real():
    missing = sorted(set(REAL) - set(LINES)) + sorted(set(TASK_TINY) - set(LINES))
    assert missing == [], f"documented lines run for real by this test are gone (update REAL / TASK_TINY): {missing}"
    assert len(LINES) >= 25
    assert len({SOURCES[line] for line in LINES}) >= 8, "the docs/ pages' command lines are not read"
    assert set(REAL_TARGETS) <= set(TARGETS), "a make target this test runs for real is gone from `make help`"


def test_the_readme_starts_with_the_two_commands_and_fits_a_page():
    """The README's first command lines are the main job and the tests (both run by test_doc_line), and it stays
    short: everything else lives in docs/."""
    text = (ROOT / "README.md").read_text()
    assert bash_lines(text)[:2] == ["make demo", "make test"]
    assert text.index("```bash") < 200, "the two commands are not at the top of the README"
    assert len(text.splitlines()) <= 200


def test_the_readme_links_resolve():
    """Every relative link and image of README.md and docs/*.md names a file that exists."""
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


@pytest.mark.parametrize("line", LINES, ids=[f"{i:02d} {SOURCES[line].removeprefix('docs/')[:-3]}: {line[:60]}"
                                             for i, line in enumerate(LINES)])
def test_doc_line(world, line):
    if line == "make demo":  # ran once for the module (its runs are what the other lines read)
        assert (world.root / "runs" / "demo" / "report.md").is_file()
        assert world.demo_how == "real"
        return
    if SOURCES[line] == "docs/model-card-example.md" and line.startswith("recurlen finetune"):
        how = run_reproduce_line(line, world)
    else:
        how = run_line(line, world.root, world.checks)
    if line in REAL:
        assert "real" in how or how == "served", how
    if line.startswith("recurlen eval base=runs/demo"):
        assert json.loads((world.root / "runs" / "eval" / "results.json").read_text())["runs"]


def run_reproduce_line(line: str, world: World) -> str:
    """A model card's Reproduce training line, dry-run as in a fresh clone that has run the card's lines before it: in
    a directory of its own, where the base it post-trains is the tiny demo's checkpoint without its config.yaml (the
    tiny demo's runs hold other settings than the card's, which a dry run rightly refuses to resume)."""
    fresh = world.root / "reproduce"
    if not fresh.exists():
        checkpoints = fresh / "runs" / "demo" / "pretrain" / "checkpoints"
        shutil.copytree(world.root / "runs" / "demo" / "pretrain" / "checkpoints", checkpoints)
    cwd = Path.cwd()
    os.chdir(fresh)
    try:
        return run_line(line, fresh, world.checks)
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("target", uncovered_targets())
def test_make_target(world, target):
    """The targets of `make help` that no documented line runs, with their default variables."""
    run_make([target], world.root, world.checks, REAL_TARGETS.get(target))


def test_every_make_target_is_covered():
    covered = {target_of(shlex.split(line)[1:]) for line in LINES if line.startswith("make")}
    assert set(TARGETS) == covered | set(uncovered_targets())
    assert {"demo", "finetune", "eval", "test", "lint", "tensorboard"} <= covered


@pytest.mark.parametrize("broken", [
    "recurlen finetune model=780m intervention=fitted_noise trainer.max_stepz=1000",  # a renamed key
    "recurlen eval base=runs/demo/pretrain --out runs/eval seq_lenn=1024",             # a typo in a setting
    "recurlen eval base=runs/demo/pretrain --outdir runs/eval",                        # a flag that does not exist
    "recurlen finetune model=781m",                                                    # an unknown choice
    "recurlen finetunee model=780m",                                                   # a command that is gone
    "make finetune MODEL=780m INTERVENTION=tbptttt",                                   # through make
    "make finetunes MODEL=780m",                                                       # a target that is gone
    "make bench-gpu ARGS=--quik",                                                      # a benchmark option
    "sbatch scripts/slurm_finetune.sbatch trainer.max_step=1000",                      # through the SLURM script
    "torchrun --nnodes=2 --nproc-per-node=8 --master-prt=29500 -m recurlen finetune model=780m",
    "hf download state-spaces/mamba2-780m --includ '*.json'",                         # a hub CLI option
    "hf downlod state-spaces/mamba2-780m",                                             # a hub CLI command
    "export HF_HUB_OFFLINE",                                                           # not an assignment
    "make finetune MODEL=780m ARGS=data.source=data/pile/train/01.jsonl.zst",          # a data file not fetched
])
def test_a_broken_line_fails(world, broken):
    """What this test exists for: a documented line that stopped working fails it."""
    with pytest.raises((AssertionError, SystemExit)):
        run_line(broken, world.root, world.checks)


@pytest.mark.slow  # each trains and evaluates small models (~25 s together on 2 idle cores)
@pytest.mark.parametrize("line", list(TASK_TINY))
def test_task_lines_for_real(scratch, line):
    """The long-context tasks' documented lines, trained and evaluated for real (tiny): each writes its results.json."""
    task = line.split()[1]
    before = {p: p.stat().st_mtime_ns for p in scratch.glob(f"runs/{task}/**/results.json")}
    how = run_line(line, scratch, Checks(), real=TASK_TINY[line])
    assert how == "real", how
    written = [p for p in scratch.glob(f"runs/{task}/**/results.json") if before.get(p) != p.stat().st_mtime_ns]
    assert written, f"`{line}` wrote no runs/{task}/.../results.json"
    for path in written:
        assert json.loads(path.read_text())["task"] == task, path
