"""Files and folders a command writes, checked before the work starts (docs/reliability.md, "Outputs").

An output path is refused in one line when it cannot be written: its folder is missing or is a
file, the path is a folder, it names the same file as one of the command's inputs or other outputs,
or it is not writable. Otherwise:

- a regular file (new or replaced) is written to a temporary file beside its target and renamed
  into place once complete; a new file gets mode ``0o666 & ~umask``, a replaced one keeps its mode;
- a symlink is followed: its target is written (the link stays);
- a character device or a FIFO (``/dev/null``, a named pipe) is written directly: it cannot be
  replaced and is never turned into a regular file.

A write that fails (disk full, a device that refuses) is a one-line :class:`OutputError`, and no
temporary file is left behind.
"""
from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from milegpo_cli.errors import MilegpoError


class OutputError(MilegpoError):
    """An output path that cannot be written (one line naming the option and the path)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name one file (an existing one by inode, else by resolved path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class OutputFile:
    """One output file of a command: checked when made, written by :meth:`write` (or
    :func:`write_together`) at the end of the work."""

    def __init__(self, path: str | Path, option: str, others: Mapping[str, str | Path | None] | None = None):
        """``option``: how the user named it (``-o``); ``others``: role -> path of the command's
        inputs and other outputs that it must not be (``{"the input": "r.jsonl"}``)."""
        self.path, self.option = Path(path), option
        self.target = Path(os.path.realpath(self.path))  # a symlink's target (a dangling one: the path it names)
        self.direct = False  # a character device or FIFO: written in place
        self.mode: int | None = None  # an existing regular file's mode, kept
        self._tmp: str | None = None
        self._lines: Iterable[str] = ()
        try:
            st = os.stat(self.target)
        except (FileNotFoundError, NotADirectoryError):  # a new file (or one under a regular file)
            st = None
        except OSError as err:
            raise self._error(f"cannot be written ({err.strerror})") from None
        for role, other in (others or {}).items():  # a character device (/dev/null) may take several outputs
            if other is not None and not (st and stat.S_ISCHR(st.st_mode)) and _same(self.path, Path(other)):
                raise self._error(f"is the same file as {role} {other}; write to another file")
        if st is None:
            folder = self.target.parent
            if not folder.exists():
                raise self._error(f"cannot be written: folder {folder} does not exist")
            if not folder.is_dir():
                raise self._error(f"cannot be written: {folder} is a file, not a folder")
        elif stat.S_ISDIR(st.st_mode):
            raise self._error("is a folder; give a file name")
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            self.direct = True
        elif stat.S_ISREG(st.st_mode):
            self.mode = stat.S_IMODE(st.st_mode)
        else:
            raise self._error("is neither a file, a character device nor a FIFO")
        where = self.target if self.direct else self.target.parent
        if not os.access(where, os.W_OK):
            raise self._error(f"cannot be written: {where} is not writable")

    def _error(self, reason: str) -> OutputError:
        return OutputError(f"{self.option} {self.path}: {reason}")

    def stage(self, lines: Iterable[str]) -> None:
        """Write ``lines`` (each followed by a newline) to a temporary file beside the target; a
        device or FIFO is written by :meth:`commit`."""
        if self.direct:
            self._lines = lines
            return
        fd, self._tmp = tempfile.mkstemp(dir=self.target.parent, prefix=f".{self.target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), self.mode if self.mode is not None else 0o666 & ~_umask())
                _write_lines(f, lines)
        except BaseException as err:
            self.discard()
            if isinstance(err, OSError):
                raise self._error(f"cannot be written ({err.strerror})") from None
            raise

    def commit(self) -> None:
        """Put the staged file in place (or write the device / FIFO)."""
        try:
            if self.direct:
                with open(self.target, "w", encoding="utf-8") as f:
                    _write_lines(f, self._lines)
            else:
                os.replace(self._tmp, self.target)
                self._tmp = None
        except OSError as err:
            self.discard()
            raise self._error(f"cannot be written ({err.strerror})") from None

    def discard(self) -> None:
        if self._tmp is not None:
            os.unlink(self._tmp)
            self._tmp = None

    def write(self, lines: Iterable[str]) -> None:
        write_together([(self, lines)])


def _write_lines(f, lines: Iterable[str]) -> None:
    for line in lines:
        f.write(line)
        f.write("\n")


def write_together(outputs: Sequence[tuple[OutputFile, Iterable[str]]]) -> None:
    """Stage every output, then put them in place; when one fails, no temporary file is left."""
    try:
        for out, lines in outputs:
            out.stage(lines)
        for out, _ in outputs:
            out.commit()
    finally:
        for out, _ in outputs:
            out.discard()


def check_folder(path: str | Path, option: str) -> None:
    """Check, creating nothing, that folder ``path`` can be made and written: its nearest existing
    ancestor must be a folder in which this process can create a folder (probed with a temporary
    one, so read-only file systems, immutable folders and /proc are caught even as root)."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise OutputError(f"{option} {path}: {existing} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".milegpo-probe-"))
    except OSError as err:
        raise OutputError(f"{option} {path}: cannot write in {existing} ({err.strerror})") from None
