"""Write a small corpus of your own kind: a folder of .txt files, one document per file (docs/data.md's example).

    .venv/bin/python scripts/example_corpus.py data/my-corpus

The documents are the sections of this project's docs/*.md pages (one file per `## ` section): real text that
every checkout has, ~180 KB in ~150 files, the size of corpus for which the held-out defaults of the data groups
do not fit and docs/data.md's small-corpus settings do.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def sections(text: str) -> list[str]:
    """The page cut at its `## ` headings (the part before the first one is a section too); empty parts dropped."""
    return [part.strip() for part in re.split(r"(?m)^(?=## )", text) if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (created; its .txt files are replaced)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    count = size = 0
    for page in sorted(DOCS.glob("*.md")):
        for i, text in enumerate(sections(page.read_text())):
            (args.out / f"{page.stem}-{i:02d}.txt").write_text(text + "\n")
            count, size = count + 1, size + len(text) + 1
    print(f"{args.out}: {count} .txt files, {size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
