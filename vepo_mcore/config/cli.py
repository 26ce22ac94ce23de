"""How an entry script ends: a user's mistake is one line on rank 0, a bug keeps its traceback.

    if __name__ == "__main__":
        run_cli(main)

A ValueError or FileNotFoundError raised by vepo_mcore or tools/ (a config field, a data line, a
path, a shape: STYLE.md's errors a user can act on) prints `error: <message>` once, on rank 0, and
exits with EXIT_USER_ERROR on every rank. Anything else, or the same errors raised inside torch or
megatron (an internal failure), keeps its traceback. `--debug` on the command line or VEPO_DEBUG=1
shows the traceback of user errors too.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_USER_ERROR = 2
USER_ERRORS = (ValueError, FileNotFoundError)
_OURS = (
    Path(__file__).resolve().parents[1],
    *(Path(__file__).resolve().parents[2] / d for d in ("tools", "recipes")),
)


def debug_requested(argv: list[str] | None = None) -> bool:
    """--debug among the arguments, or VEPO_DEBUG set to something other than 0/false/empty."""
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get("VEPO_DEBUG", "").lower() not in ("", "0", "false", "no")


def is_user_error(exc: BaseException) -> bool:
    """A ValueError/FileNotFoundError whose innermost frame is in vepo_mcore or tools/ (raised for the
    user), not one from inside a library."""
    if not isinstance(exc, USER_ERRORS):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    where = Path(frames[-1].filename).resolve()
    return any(where.is_relative_to(root) for root in _OURS)


def check_output_folder(
    field: str, path: str | None, create: bool = True, overwrite: bool | None = None
) -> None:
    """Check that the output folder `path` (of config field or flag `field`) can be written, creating
    it when `create` (else its nearest existing parent must be a writable folder): a ValueError naming
    the field and the reason otherwise (a file in the way, no permission; a folder that is not empty
    when `overwrite` is False). None is no folder."""
    if not path:
        return
    if Path(path).exists() and not Path(path).is_dir():
        raise ValueError(f"{field} {path}: a file is in the way of the output folder")
    if overwrite is False and Path(path).is_dir() and any(Path(path).iterdir()):
        raise ValueError(
            f"{field} {path} is not empty; pass --overwrite to write into it, or name a new folder"
        )
    if create:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{field} {path}: cannot create the folder ({exc.strerror or exc})") from None
    existing = next(p for p in (Path(path), *Path(path).absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{field} {path}: cannot create the folder ({existing} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{field} {path}: {existing} is not writable")


def run_cli(main: Callable[[], Any], argv: list[str] | None = None) -> Any:
    """Call main(); a user error prints one line on rank 0 (stderr) and exits EXIT_USER_ERROR."""
    try:
        return main()
    except USER_ERRORS as exc:
        if debug_requested(argv) or not is_user_error(exc):
            raise
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {exc}  (--debug or VEPO_DEBUG=1 for the traceback)", file=sys.stderr, flush=True)
        _leave_process_group()
        sys.exit(EXIT_USER_ERROR)


def _leave_process_group() -> None:
    """Tear down torch.distributed if the failing run had joined it (no 'not destroyed' warning)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
