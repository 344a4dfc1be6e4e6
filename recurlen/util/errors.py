"""Errors that are the user's to fix, and how the command line shows them.

A user error is a problem the user fixes by changing what they typed or what is on disk: an unknown key,
a bad value, a missing path. The command line (`recurlen.commands.cli`) prints it as one line,
`recurlen <command>: error: <message>`, and exits with status 2, without a traceback. Everything else is
a bug and keeps its traceback. `--debug` on any command, or RECURLEN_DEBUG=1 in the environment, shows
the traceback of user errors too.

Two ways to mark an error as the user's:
- raise `UserError` (a ValueError, so callers that catch ValueError keep working) from anywhere, e.g.
  when a dataset named on the command line turns out to be missing only when it is opened;
- run argument / config validation inside `with user_input():`, which turns the ValueError and
  FileNotFoundError that validation raises (omegaconf merges, dataclass __post_init__, path checks)
  into UserError. Outside such a block a plain ValueError is a bug: it shows its traceback.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

DEBUG_ENV = "RECURLEN_DEBUG"


class UserError(ValueError):
    """An error the user fixes (bad argument, unknown key, missing file): one line, no traceback."""


@contextlib.contextmanager
def user_input() -> Iterator[None]:
    """Treat ValueError / FileNotFoundError raised inside as user errors (argument and config validation)."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, FileNotFoundError) as err:
        raise UserError(str(err)) from err


class Interrupted(Exception):
    """Training stopped on a signal after writing a checkpoint: the command exits 128 + the signal number (not 0:
    a scheduler must not record success) with one line saying the run is resumable."""

    def __init__(self, signum: int, *, step: int, checkpoint: str | None, during: str | None = None) -> None:
        import signal

        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        if during is not None:  # stopped in work that keeps no checkpoint: `during` says what, and what was kept
            super().__init__(f"interrupted by {name} during {during}")
            return
        where = f"checkpoint {checkpoint} written" if checkpoint else "no checkpoint could be written"
        super().__init__(f"interrupted by {name} after step {step}, {where}; resumable: "
                         "rerun the same command (resume=auto) to continue exactly from it")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class NonFinite(UserError):
    """Training produced a NaN or an infinity: stopped before that step's update or any checkpoint of it.

    Raised where the value appears (the loss, a gradient, the carried state, the weights about to be saved)
    with the step and what went non-finite; `recurlen.training.finetune` adds where to go back to (the newest
    checkpoint from before the divergence began, recurlen.training.divergence) and the settings that do it
    (`with_advice`), which the command line turns into the exact command to run."""

    def __init__(self, what: str, *, step: int, advice: str = "", elsewhere: bool = False,
                 overrides: tuple[str, ...] = ()) -> None:
        self.what = what
        self.step = step
        self.elsewhere = elsewhere
        """Under DDP: the value went non-finite on another rank; that rank says what, this one stops quietly."""
        self.advice = advice
        self.overrides = tuple(overrides)
        """key=value settings that carry out the advice (replacing the same keys of the command that failed)."""
        text = f"{what} at global step {step}; training stopped and no checkpoint holds it"
        super().__init__(f"{text}; {advice}" if advice else text)

    def with_advice(self, advice: str, overrides: list[str] | tuple[str, ...] = ()) -> NonFinite:
        return NonFinite(self.what, step=self.step, advice=advice, elsewhere=self.elsewhere, overrides=tuple(overrides))

    def command(self, program: str, words: list[str]) -> str:
        """The command that follows the advice: `words` with the advice's settings in place of their own."""
        import shlex

        keys = {o.split("=", 1)[0] for o in self.overrides}
        kept = [w for w in words if w.split("=", 1)[0] not in keys and w not in ("--dry-run",)]
        return shlex.join([*program.split(), *kept, *self.overrides])


def debug_requested(argv: list[str]) -> bool:
    """--debug on the command line or RECURLEN_DEBUG set to something other than 0 / empty."""
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "0").strip().lower() not in ("", "0", "false", "no")


def one_line(err: BaseException) -> str:
    """The message of an error on one line (multi-line messages are joined with '; ')."""
    text = str(err).strip() or type(err).__name__
    if isinstance(err, FileNotFoundError) and err.filename and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def load_error(path: str | os.PathLike, err: BaseException) -> UserError:
    """Why a weights file did not load, in one line that names it.

    torch's own messages run over many lines and, for a file weights_only refuses, advise weights_only=False,
    which would let the file run code: that advice is never passed on."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = None
    text = str(err).strip()
    if size == 0:
        why = "the file is empty"
    elif "Weights only load failed" in text and zipfile.is_zipfile(p):
        why = ("it holds something other than tensors and plain containers (damaged, or not a weights file); "
               "it was not loaded, as loading it could run code")
    elif "Weights only load failed" in text:
        why = "it is damaged, truncated or not a PyTorch weights file"
    else:
        first = text.splitlines()[0].split(". ")[0] if text else type(err).__name__
        why = f"it is damaged or truncated ({first})"
    return UserError(f"{p} cannot be loaded: {why}; write or download it again")


__all__ = ["DEBUG_ENV", "Interrupted", "NonFinite", "UserError", "debug_requested", "load_error", "one_line",
           "user_input"]
