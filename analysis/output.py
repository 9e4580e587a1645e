"""Where commands write: output directories and files checked before any work, and written as a whole.

Rules (:data:`OUT_RULE`): an output directory must be new or empty; ``--force`` replaces one that holds only a
kvsim result (run, comparison, sweep or validation), atomically (written beside it, then renamed over it); a directory
holding anything else is refused even with ``--force``. A kvsim result is recognised by the marker file kvsim
writes into it (:data:`RESULT_MARKER`), not by its file names alone: a user's own ``config.json`` or
``summary.json`` is never replaced. Files are written to a temporary file and renamed. No output may be one of
the command's inputs, nor a directory holding one (:func:`refuse_inputs`; paths compared resolved), whatever
``--force`` says.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from analysis.marker import RESULT_MARKER, write_marker as _write_marker  # noqa: F401  (RESULT_MARKER re-exported)


def default_out_dir(kind: str = "sim") -> Path:
    """A new ``runs/<kind>-<UTC time>[-N]`` directory, claimed by creating it (``mkdir`` fails for a name another
    process took first, so two runs started in the same second get two directories) and removed at exit if it is
    still empty (a run that failed before writing leaves nothing behind). Where ``runs/`` cannot be created the
    name is returned unclaimed, for :class:`OutputDir` to report."""
    import atexit

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    suffix = 0
    parent_made = not Path("runs").exists()      # a runs/ made here goes too if nothing was written into it
    while True:
        out = Path("runs") / (f"{kind}-{stamp}-{suffix}" if suffix else f"{kind}-{stamp}")
        try:
            out.mkdir(parents=True)
        except FileExistsError:
            suffix += 1
            continue
        except OSError:
            return out
        atexit.register(_remove_if_empty, out, parent_made)
        return out


def _remove_if_empty(directory: Path, parent_too: bool = False) -> None:
    try:
        directory.rmdir()           # refused (and ignored) once the result is in it
        if parent_too:
            directory.parent.rmdir()
    except OSError:
        pass


# ---- output paths: checked before any work; --force replaces a kvsim result as a whole ----------------------
# What kvsim writes into a result directory (simulate, compare, sweep, validate). ``--force`` replaces a
# directory only if everything in it is one of these, so a folder holding anything else (a user's files, a
# hardware replay's shapes.parquet) is never deleted.
RESULT_FILES = frozenset({"requests.parquet", "iterations.parquet", "summary.json", "config.json", "report.html",
                          "compare.csv", "compare.parquet", "sweep.parquet", "sweep.csv", "sweep.html",
                          "validation.md", "errors.csv", "overlay.html", "tiers.parquet", "memory.parquet"})
_RUN_FILES = frozenset({"requests.parquet", "iterations.parquet", "summary.json", "config.json", "report.html",
                        "tiers.parquet", ".kvsim-result"})     # (analysis.results.write_run marks each run it writes)
# the hardware replay that ``kvsim validate`` without --hw-run saves in its result (hwbackend.replay.cli.write_hw_run)
_HW_RUN_FILES = _RUN_FILES | {"shapes.parquet", "counters.json", "trace.parquet"}
OUT_RULE = ("--out must be a new or empty directory; --force replaces one that holds only a kvsim result (run, "
            "comparison, sweep or validation, marked by the .kvsim-result file kvsim writes into it) as a whole, atomically "
            "(written beside it, then renamed over it); a directory holding anything else is refused even with "
            "--force")


def _is_result_entry(entry: Path) -> bool:
    """Whether ``entry`` (inside an output directory) is something kvsim writes."""
    import re
    if entry.is_symlink():
        return False
    if entry.is_file():
        return entry.name in RESULT_FILES or entry.name == RESULT_MARKER
    if not entry.is_dir():
        return False
    if entry.name == "points":               # sweep points: <key>.json (and <key>.tmp while being written)
        return all(p.is_file() and p.suffix in (".json", ".tmp") for p in entry.iterdir())
    if re.fullmatch(r"run\d+", entry.name):   # compare --save-runs
        return all(p.is_file() and p.name in _RUN_FILES for p in entry.iterdir())
    if entry.name == "hw":                    # validate's fresh replay
        return all(p.is_file() and p.name in _HW_RUN_FILES for p in entry.iterdir())
    if entry.name == "tenants":               # kvsim colocate: tenants/<name>/ run folders
        return all(t.is_dir() and not t.is_symlink() and all(p.is_file() and p.name in _RUN_FILES for p in t.iterdir())
                   for t in entry.iterdir())
    if entry.name in ("static", "elastic"):   # kvsim colocate --sharing both: one co-located result per sharing
        return all(_is_result_entry(p) for p in entry.iterdir())
    return False


def command_inputs(args) -> list[Path]:
    """The files and directories a command reads, from its parsed options (``--trace``, ``--profile``,
    ``--hw-run``, ``--from-run``, ``--grid``, the FILE of ``traces convert``, a ``report``'s run directories expanded to the files read in
    them); only those that exist as paths (a public trace name is not one)."""
    found = []
    for name in ("trace", "profile", "hw_run", "from_run", "grid", "file"):
        value = getattr(args, name, None)
        found += [Path(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v]
    for run in getattr(args, "runs", None) or []:
        from analysis.results import OPTIONAL_RUN_FILES, RUN_FILES     # pandas: only for commands that read runs
        found += [Path(run) / name for name in RUN_FILES + OPTIONAL_RUN_FILES]
    return [path for path in found if os.path.lexists(path)]


def refuse_inputs(out, inputs, flag: str = "--out") -> None:
    """Refuse (``ValueError`` naming ``flag``) an output path that is one of ``inputs`` or a directory holding
    one: writing it, even with ``--force``, would destroy what the command reads. Paths are compared resolved
    (symbolic links, ``..``), and by inode where both exist (a hard link)."""
    target = os.path.realpath(out)
    for source in inputs or ():
        resolved = os.path.realpath(source)
        same = resolved == target or (os.path.exists(out) and os.path.exists(source)
                                      and os.path.samefile(out, source))
        if same or resolved.startswith(target.rstrip(os.sep) + os.sep):
            what = "is" if same else "holds"
            raise ValueError(f"{flag} {out} {what} one of the command's inputs ({source}); kvsim never writes over "
                             f"what it reads, even with --force: choose another {flag}")


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _check_can_create(path: Path, flag: str, shown: str) -> None:
    """Refuse (OSError naming ``flag``) unless entries can be created beside ``path``: its nearest existing
    ancestor must be a directory in which kvsim can make a (probe) directory."""
    import tempfile
    parent = _nearest_existing(path.parent if path.name else path)
    if not parent.is_dir():
        raise NotADirectoryError(f"{flag} {shown}: {parent} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".kvsim-probe-"))
    except OSError as exc:
        raise PermissionError(f"{flag} {shown}: cannot create a directory in {parent} ({exc.strerror or exc}): "
                              "not a writable directory") from None


def _out_text(value) -> str:
    return repr(str(value)) if str(value).strip() != str(value) or not str(value) else str(value)


NAME_MAX_BYTES = 255
"""The longest file or directory name Linux file systems take (ext4, xfs, tmpfs: ``NAME_MAX``)."""


def _non_empty_path(value, flag: str) -> Path:
    if value is None or not str(value).strip():
        raise ValueError(f"{flag} {_out_text(value or '')}: an empty path; name the file or directory to write")
    path = Path(value)
    longest = max(path.parts, key=lambda part: len(part.encode()), default="")
    if len(longest.encode()) > NAME_MAX_BYTES:        # (was a raw "[Errno 36] File name too long", helper-61)
        raise ValueError(f"{flag} {str(value)[:40]}...: a name of {len(longest.encode())} bytes, longer than the "
                         f"{NAME_MAX_BYTES} a file or directory name may have")
    return path


class OutputDir:
    """The result directory of a command (``--out``), checked before any work and written as a whole.

    * An output that is one of ``inputs`` or holds one (:func:`refuse_inputs`) is refused.
    * ``--out ''``, a path under a file or where nothing can be created (``/proc/x``), and an existing file
      are refused at once (``OSError`` / ``ValueError`` naming ``flag``).
    * An existing directory must be empty, or hold only a kvsim result and come with ``force``; a directory
      with anything else in it is refused even with ``force`` (:data:`OUT_RULE`).
    * :meth:`writing` yields the folder to write into: a fresh sibling temporary directory, renamed over
      ``path`` when the block ends without an exception (nothing stale survives: an old report.html, saved
      runs of a compare, points of another sweep grid); removed, with the old result intact, on failure.
    """

    def __init__(self, path, force: bool = False, flag: str = "--out", resumable: bool = False, inputs=()):
        self.path = _non_empty_path(path, flag)
        self.flag, self.force = flag, force
        shown = str(self.path)
        refuse_inputs(self.path, inputs, flag)
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"{flag} {shown} is a file, not a directory")
        self.existing = self.path.is_dir() and any(self.path.iterdir())
        if self.existing:
            foreign = sorted(e.name for e in self.path.iterdir() if not _is_result_entry(e))
            if foreign:
                raise FileExistsError(f"{flag} {shown} is not empty and is not a kvsim result (it holds "
                                      f"{_listed(foreign)}); "
                                      f"choose a new or empty directory (--force replaces only a kvsim result)")
            if not (self.path / RESULT_MARKER).is_file() and (force or not resumable):
                listed = _listed(sorted(e.name for e in self.path.iterdir()))
                raise FileExistsError(f"{flag} {shown} holds files named like a kvsim result ({listed}) but not the "
                                      f"{RESULT_MARKER} file kvsim writes into its results, so they may be yours: "
                                      f"kvsim does not replace them, even with --force; choose another {flag} (or "
                                      "remove the directory yourself if it is an old kvsim result)")
            if not force and not resumable:
                raise FileExistsError(f"{flag} {shown} already holds a kvsim result; choose another {flag} or pass "
                                      "--force to replace it")
        _check_can_create(self.path, flag, shown)

    @property
    def replaces(self) -> bool:
        """Whether writing replaces an existing result (``force`` on a non-empty directory)."""
        return self.existing and self.force

    def writing(self):
        """Context manager: the directory to write into (see the class docstring)."""
        import contextlib
        import shutil
        import tempfile

        @contextlib.contextmanager
        def staged():
            target = Path(os.path.realpath(self.path)) if self.path.is_symlink() else self.path
            target.parent.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.kvsim-new-"))
            try:
                yield stage
                _write_marker(stage)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            os.chmod(stage, 0o777 & ~_umask())
            old = None
            if target.is_dir() and any(target.iterdir()):
                old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.kvsim-old-"))
                os.replace(target, old / "result")
            try:
                os.replace(stage, target)   # POSIX: an empty directory (e.g. a claimed default name) is replaced
            except OSError:                 # atomically, so no other run can take the name in between
                if not (target.is_dir() and not any(target.iterdir())):
                    raise
                target.rmdir()
                os.replace(stage, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return staged()

    def mark(self) -> None:
        """Mark :attr:`path` as a kvsim result (for a command that writes into it in place, such as a resumed
        sweep; :meth:`writing` marks what it writes)."""
        _write_marker(self.path)


def _listed(names: list[str]) -> str:
    """The first four names, and how many more."""
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_out_file(path, force: bool, flag: str = "--out", inputs=(), replaceable=None) -> Path:
    """Check a file that a command will write (``report --out``, ``capacity --out``, ``traces convert --out``)
    before any work: not empty, not one of the command's ``inputs`` (:func:`refuse_inputs`), not a directory,
    not existing unless ``force``, creatable. ``replaceable`` (``(path, what)``: a predicate on an existing file
    and what it accepts): with ``force``, an existing file it refuses is kept and the command refused.

    Raises:
        ValueError / OSError: one line naming ``flag`` and the path.
    """
    out = _non_empty_path(path, flag)
    refuse_inputs(out, inputs, flag)
    if out.is_dir():
        raise IsADirectoryError(f"{flag} {out} is a directory; {flag} names the file to write")
    if out.exists() and not force:
        raise FileExistsError(f"{flag} {out} already exists; choose another {flag} or pass --force to replace it")
    if out.exists() and replaceable is not None and not replaceable[0](out):
        raise FileExistsError(f"{flag} {out} exists and is not {replaceable[1]}; --force replaces only such a "
                              f"file: choose another {flag}")
    _check_can_create(out, flag, str(out))
    return out


def is_report_file(path) -> bool:
    """Whether ``path`` is an HTML report kvsim wrote (``kvsim report``, ``simulate --report``): its head holds
    the ``<title>kvsim report`` that :func:`analysis.report.write_report` gives every report."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return head.startswith(b"<!DOCTYPE html>") and b"<title>kvsim report" in head


CAPACITY_FILE_MARK = {"written_by": "kvsim capacity"}
"""The first key of every ``kvsim capacity --out`` JSON file: ``--force`` replaces only such a file
(:func:`is_capacity_file`)."""


def is_capacity_file(path) -> bool:
    """Whether ``path`` is a JSON object that ``kvsim capacity --out`` wrote (:data:`CAPACITY_FILE_MARK`, or,
    written before the mark, a ``capacity_req_per_s`` and ``search_steps`` pair)."""
    import json
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(record, dict):
        return False
    return (record.get("written_by") == CAPACITY_FILE_MARK["written_by"]
            or {"capacity_req_per_s", "search_steps"} <= record.keys())


CAPACITY_REPLACEABLE = (is_capacity_file, "a capacity result kvsim wrote")
"""``check_out_file``'s ``replaceable`` for ``kvsim capacity --out``."""


def write_file_atomic(path, write) -> Path:
    """Call ``write(temporary_path)``, then rename the temporary file over ``path`` (same directory), so
    that ``path`` is either the old file or the whole new one."""
    import tempfile
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".kvsim-new")
    os.close(handle)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return out
