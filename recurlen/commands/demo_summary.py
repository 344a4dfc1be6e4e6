"""What `recurlen demo` prints when it has finished: the report's verdict lines and its count of checks, where the
report is, and what to run next. The report itself (report.md, ~150 lines of tables) stays in its file; the lines
printed are copied from it, so that they never say other numbers than the report does.
"""

from __future__ import annotations

from pathlib import Path

DEMO_ROOTS = ("runs/demo", "runs/demo-quick")
"""The demos whose runs `make finetune` and `make eval` use, the full one first (the Makefile's DEMO_ROOTS)."""


def report_verdicts(report: str) -> list[str]:
    """The bullet lines of the report's Verdicts section (each run's verdict, then the in-context costs), then its line
    counting the checks (where it has one, its Markdown bold dropped)."""
    lines, verdicts = report.splitlines(), []
    if "## Verdicts" in lines:
        for line in lines[lines.index("## Verdicts") + 1:]:
            if line.startswith("## "):
                break
            if line.startswith("- "):
                verdicts.append(line)
    count = [line.replace("**", "") for line in lines if line.startswith("**") and "checks passed" in line][:1]
    return verdicts + count


def seed_counts(report: str) -> list[str]:
    """With several seeds, one line from the report's "Across seeds" table: each run's verdicts counted over seeds
    (the report's own cells, copied)."""
    lines = report.splitlines()
    if "## Across seeds" not in lines:
        return []
    counts = []
    for line in lines[lines.index("## Across seeds") + 1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[0] not in ("run", "check"):
            counts.append(f"{cells[0]} {cells[1]}")
        elif counts and not line.startswith("|"):
            break  # the first table only: the checks' table follows it
    return [f"Across seeds: {'; '.join(counts)} (the report's 'Across seeds' section)"] if counts else []


def _finished(root: Path) -> bool:
    """A demo the Makefile's next steps would use: its report written and its base trained."""
    return (root / "report.md").is_file() and (root / "pretrain" / "checkpoints" / "last.ckpt").is_file()


def next_lines(root: Path, *, quick: bool, interventions: list[str]) -> list[str]:
    """What to run after this demo: the full demo after the quick one; a post-training of this base and its
    evaluation where `make finetune` would take this demo's base; the export of a fixed run with its card."""
    lines = []
    if quick:
        lines.append("make demo            # the full demo: five interventions, evaluated to 32T (docs/demo.md)")
    used = next((Path(r) for r in DEMO_ROOTS if _finished(Path(r))), None)
    if used is not None and used.resolve() == root.resolve():
        lines += ["make finetune        # post-train this demo's base (TBTT), then: make eval RUNS=<its run directory>",
                  "make eval            # this demo's runs with other settings (ARGS='seq_len=... num_sequences=...')"]
    fixed = next((n for n in ("state_passing", "tbptt") if n in interventions), None)
    if fixed is not None:
        lines.append(f"make export RUN={root / 'post' / fixed}   # the model with its card, for the Hub")
    return lines


def closing_lines(root: str | Path, *, quick: bool, interventions: list[str]) -> list[str]:
    """The demo's last lines (see the module docstring)."""
    root = Path(root)
    report = root / "report.md"
    text = report.read_text()
    lines = ["", "recurlen demo: done", *report_verdicts(text), *seed_counts(text), "",
             f"The report, with every table, the checks and the plots: {report} (its numbers in "
             f"{root / 'results.json'})."]
    after = next_lines(root, quick=quick, interventions=interventions)
    return lines + (["", "Next:", *(f"  {line}" for line in after)] if after else [])


__all__ = ["DEMO_ROOTS", "closing_lines", "next_lines", "report_verdicts", "seed_counts"]
