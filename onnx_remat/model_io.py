"""Reading and writing ONNX models and onnxruntime-training artifacts directories, safely.

Reading: :func:`load_model` reads a model file, or the ``training_model.onnx`` of an artifacts
directory (as written by ``onnxruntime.training.artifacts.generate_artifacts``), with or without
external data, and turns every way a file can be broken into a one-line :class:`RematError`.

Writing: every file or folder onnx-remat writes goes through one mechanism
(:func:`write_file`, :func:`save_model`, :func:`write_artifacts`):

* the content is written to a temporary in the output's own folder (``.NAME.XXXXXXXX.tmp``), so
  the final step is a rename within one file system: readers see the old state or the complete
  new output, never a partial one;
* without ``force`` that rename is *exclusive*: ``renameat2(RENAME_NOREPLACE)`` where the kernel
  and file system have it (Linux >= 3.15 on ext4, xfs, btrfs, tmpfs, overlayfs), else
  ``link()`` (fails when the name exists) for files and ``mkdir()`` of the name then a rename
  onto that empty folder for directories. Two writers racing for one name: exactly one wins,
  the other gets "already exists". (Checking ``exists()`` and then renaming is not enough: both
  check, both rename, the second silently replaces the first.) With ``force`` a file is
  replaced by ``os.replace`` and a folder by ``renameat2(RENAME_EXCHANGE)`` (else: old aside,
  new in, old removed), and only a folder that is an artifacts directory or empty is replaced;
* an output is never a path the command reads, ``force`` or not (:func:`check_output`);
* temporaries are removed in ``finally`` blocks, with signals held back while a rename or a
  removal runs (:func:`onnx_remat.interrupts.critical`), and the command line turns SIGTERM and
  SIGHUP into exceptions too (:func:`onnx_remat.interrupts.install`), so nothing is left
  behind however the command ends.

:func:`output_session` groups the outputs of one command: the paths it reads (given up front,
and every model :func:`load_model` reads while it runs) are protected, :meth:`OutputSession.claim`
validates each output path before any work is done, and when the command fails or is
interrupted the outputs it had already written are removed again, so a rerun does not need
``--force``.
"""

from __future__ import annotations

import contextvars
import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from onnx_remat.errors import RematError, UsageError, one_line
from onnx_remat.forked_check import ForkedCheck
from onnx_remat.interrupts import critical
from onnx_remat.ortsim.registry import check_runtime_support, has_runtime_ops
from onnx_remat.ortsim.validity import ShapeSuspicion
from onnx_remat.runtime.load_check import PendingLoadCheck, onnxruntime_load_error, start_load_check

TRAINING_MODEL = "training_model.onnx"
EVAL_MODEL = "eval_model.onnx"
CHECKPOINT = "checkpoint"

# protobuf cannot serialize a message of 2 GiB or more: such models must use external data.
_PROTOBUF_LIMIT = 2**31 - 1


@dataclass
class LoadedModel:
    """A model read from disk and where it came from.

    ``artifacts_dir`` is set when the model is the training graph of an artifacts directory
    (given as the directory or as the file inside it); ``external_data`` when any of its
    tensors were stored in separate files, which ``files`` lists after the model file.
    """

    model: onnx.ModelProto
    path: Path
    artifacts_dir: Path | None
    external_data: bool
    files: list[Path] = field(default_factory=list)
    # onnxruntime's load check, still running in a child (load_model(defer_load_check=True));
    # None when it was settled while loading, or not needed. Settle with settle_load_check().
    load_check: PendingLoadCheck | None = field(default=None, repr=False, compare=False)
    # The model's skeleton as the load check's shape inference typed it (LoadCheck.inferred), until
    # the analysis takes it (take_inferred): the graph is inferred once per command.
    inferred: onnx.ModelProto | None = field(default=None, repr=False, compare=False)
    # The load check's static part, still running in a forked child (LoadCheck.forked): its
    # verdict, and the typed skeleton, are taken by take_inferred or settle_load_check.
    forked_check: ForkedCheck | None = field(default=None, repr=False, compare=False)

    @property
    def checking(self) -> bool:
        """Whether the load check's static part still runs beside the command (its verdict is
        taken with the typed skeleton: :meth:`take_inferred`)."""
        return self.forked_check is not None

    def settle_load_check(self) -> None:
        """Wait for the load check's verdict on the model if it is still pending (its static part in a
        forked child, onnxruntime's load in a child process); raise a refusal as a one-line
        :class:`RematError`. Does nothing the second time."""
        forked, self.forked_check = self.forked_check, None
        if forked is not None:
            self.inferred = forked.result()
        pending, self.load_check = self.load_check, None
        if pending is not None:
            refused = pending.refusal()
            if refused is not None:
                raise RematError(f"{self.path}: onnxruntime refuses to load it: {refused}")

    def take_inferred(self) -> onnx.ModelProto | None:
        """The typed skeleton of the load check (see :class:`LoadCheck`), once: it is let go here.
        Where the check's static part still runs (:attr:`checking`), this waits for its verdict
        and raises its refusal."""
        forked, self.forked_check = self.forked_check, None
        if forked is not None:
            self.inferred = forked.result()
        inferred, self.inferred = self.inferred, None
        return inferred

    def cancel_load_check(self) -> None:
        """Stop a pending load check whose verdict is no longer needed."""
        forked, self.forked_check = self.forked_check, None
        if forked is not None:
            forked.cancel()
        pending, self.load_check = self.load_check, None
        if pending is not None:
            pending.cancel()

    @property
    def eval_model_path(self) -> Path | None:
        """``eval_model.onnx`` beside the training graph, if there is one."""
        candidate = self.path.parent / EVAL_MODEL
        return candidate if candidate.is_file() and candidate != self.path else None

    @property
    def checkpoint_path(self) -> Path | None:
        """The artifacts checkpoint beside the training graph, if there is one."""
        candidate = self.path.parent / CHECKPOINT
        return candidate if candidate.exists() else None


def find_model_file(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """Resolve MODEL as the user gave it: returns (onnx file, artifacts directory or None)."""
    p = Path(path)
    if not p.exists():
        raise RematError(f"{p}: no such file or directory")
    if p.is_dir():
        if not (p / TRAINING_MODEL).is_file():
            raise RematError(
                f"{p}: a directory without {TRAINING_MODEL}; give an ONNX file or an artifacts "
                "directory written by onnxruntime.training.artifacts.generate_artifacts"
            )
        return p / TRAINING_MODEL, p
    if not p.is_file():  # a FIFO or a device would block or never end
        raise RematError(f"{p}: not a regular file; give an ONNX file or an artifacts directory")
    parent = p.parent
    in_artifacts = p.name == TRAINING_MODEL and (parent / CHECKPOINT).exists()
    return p, (parent if in_artifacts else None)


# Above this many nodes the session that judges onnxruntime's own ops is not started: its load
# grows faster than the graph (measured: 0.06 s at 1,220 nodes, 4-6 s at 20,813, minutes at
# 100,113), and the static checks still run. README "What loads" says so.
RUNTIME_LOAD_CHECK_MAX_NODES = 30_000
# Above this many nodes the whole load check runs in a forked child beside the analysis (no
# onnxruntime session is started there, so the second core is free): onnx_remat.forked_check.
FORKED_CHECK_MIN_NODES = RUNTIME_LOAD_CHECK_MAX_NODES


@dataclass
class LoadCheck:
    """What :func:`check_loadable` leaves: onnxruntime's verdict, still running in a child (None
    when it was settled or not needed), and the model's skeleton as the static check's shape
    inference typed it (None where that inference flagged a shape): a
    :class:`~onnx_remat.analysis.sizes.TensorSizes` takes its types (``inferred``) rather than
    inferring the graph again."""

    pending: PendingLoadCheck | None = None
    inferred: onnx.ModelProto | None = None
    forked: ForkedCheck | None = None  # the whole check, still running in a forked child


def check_loadable(
    model: onnx.ModelProto,
    where: str | os.PathLike = "model",
    path: str | os.PathLike | None = None,
    *,
    defer: bool = False,
) -> LoadCheck:
    """Raise a one-line :class:`RematError` if onnxruntime-training 1.19 refuses to load ``model``
    (read from ``path`` when given): the static checks
    (:func:`~onnx_remat.ortsim.registry.check_runtime_support` with types and shapes), then, where
    they flag a shape only onnxruntime can judge or the graph holds onnxruntime's own ops (whose
    types and attributes only its load checks), onnxruntime's own load with optimizations off
    (:func:`~onnx_remat.runtime.load_check.onnxruntime_load_error`).

    With ``defer`` and a ``path``, onnxruntime's load may instead be started in a child process
    (:func:`~onnx_remat.runtime.load_check.start_load_check`) and returned, pending: the caller
    settles it (:meth:`LoadedModel.settle_load_check`) before it returns anything (the returned
    :class:`LoadCheck`'s ``pending``). Above :data:`FORKED_CHECK_MIN_NODES` nodes, where no
    onnxruntime session is started, the whole check instead runs in a forked child
    (:mod:`onnx_remat.forked_check`: the returned ``forked``), beside the analysis."""
    if defer and path is not None and len(model.graph.node) > FORKED_CHECK_MIN_NODES:
        forked = ForkedCheck.start(lambda: check_loadable(model, where, path).inferred, str(where))
        if forked is not None:
            return LoadCheck(forked=forked)
    try:
        inferred = check_runtime_support(model, where, shapes=True)
    except ShapeSuspicion as suspicion:
        refused = onnxruntime_load_error(path if path is not None else model)
        if refused is not None:
            raise RematError(f"{suspicion} (onnxruntime: {refused})") from None
        return LoadCheck()
    if has_runtime_ops(model) and len(model.graph.node) <= RUNTIME_LOAD_CHECK_MAX_NODES:
        # onnxruntime's own ops (every gradient graph has them) are typed and shape-checked by its
        # load only; ONNX's inference skips them (measured by benchmarks/mutate.py: a retyped
        # accumulation buffer, a FusedMatMul attribute out of range got through the static checks).
        if defer and path is not None:
            pending = start_load_check(path, len(model.graph.node))
            if pending is not None:
                return LoadCheck(pending, inferred)
        refused = onnxruntime_load_error(path if path is not None else model)
        if refused is not None:
            raise RematError(f"{where}: onnxruntime refuses to load it: {refused}")
    return LoadCheck(None, inferred)


def load_model(path: str | os.PathLike, *, check: bool = True, defer_load_check: bool = False) -> LoadedModel:
    """Read an ONNX model (file or artifacts directory), with its external data.

    Raises :class:`RematError` with one line naming the file when it is missing, not ONNX,
    truncated, refers to external data that is not there (or not a regular file inside the
    model's folder), or is a graph onnxruntime 1.19 would refuse
    (:func:`onnx_remat.ortsim.registry.check_runtime_support`). Within an
    :func:`output_session`, every file read becomes an input no output may replace.
    ``defer_load_check``: onnxruntime's own load may still be running when this returns
    (:func:`check_loadable`); the caller must settle it (:meth:`LoadedModel.settle_load_check`).
    """
    file, artifacts_dir = find_model_file(path)
    note_input(file)
    try:
        size = file.stat().st_size
        if size > _PROTOBUF_LIMIT:
            raise RematError(
                f"{file}: {size / 2**30:.1f} GiB, more than one ONNX protobuf holds (2 GiB); "
                "models that large keep their tensors in external data"
            )
        data = file.read_bytes()
    except OSError as exc:
        raise RematError(f"{file}: cannot read ({exc.strerror or one_line(exc)})") from None
    if not data:
        raise RematError(f"{file}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        raise RematError(f"{file}: not an ONNX model, or truncated (protobuf parse error)") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise RematError(f"{file}: not an ONNX model (no graph in it)")
    external = _uses_external_data(model)
    files = [file]
    if external:
        files += _external_data_files(model, file)
        for f in files[1:]:
            note_input(f)
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(file.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:
            raise RematError(f"{file}: its external data cannot be read: {one_line(exc)}") from None
    checked = check_loadable(model, file, file, defer=defer_load_check) if check else LoadCheck()
    return LoadedModel(
        model=model,
        path=file,
        artifacts_dir=artifacts_dir,
        external_data=external,
        files=files,
        load_check=checked.pending,
        inferred=checked.inferred,
        forked_check=checked.forked,
    )


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _all_tensors(model))


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``model``, as onnx's ``external_data_helper._get_all_tensors`` lists them
    (initializers, subgraphs' included, then node attributes' tensors, then those of local
    functions' nodes), found in one walk of the nodes where it makes two: half the time on a
    training graph of 10^5 nodes, read at every load and save."""
    yield from model.graph.initializer
    initializers: list[onnx.TensorProto] = []  # of subgraphs, met on the walk (few)
    attributes: list[onnx.TensorProto] = []

    # (onnx lists no initializer of a subgraph inside a function: ``with_initializers`` False there)
    def walk(graph: onnx.GraphProto | onnx.FunctionProto, with_initializers: bool) -> None:
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("t"):
                    attributes.append(a.t)
                if a.tensors:
                    attributes.extend(a.tensors)
                kind = a.type
                if kind == onnx.AttributeProto.GRAPH:
                    subgraphs = [a.g]
                elif kind == onnx.AttributeProto.GRAPHS:
                    subgraphs = list(a.graphs)
                else:
                    continue
                for g in subgraphs:
                    if with_initializers:
                        initializers.extend(g.initializer)
                    walk(g, with_initializers)

    walk(model.graph, True)
    for function in model.functions:
        walk(function, False)
    yield from initializers
    yield from attributes


def _external_data_files(model: onnx.ModelProto, file: Path) -> list[Path]:
    """The external data files of ``model`` (read from ``file``), checked before onnx reads them.

    Each must be a regular file inside the model's folder, long enough for every tensor kept
    in it: onnx's own loader refuses the rest with a checker error that names no file.
    """
    base = file.parent.resolve()
    out: dict[Path, int] = {}  # file -> bytes the tensors need
    for t in _all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in t.external_data}
        location = entries.get("location", "")
        where = f"{file}: tensor {t.name!r}"
        if not location:
            raise RematError(f"{where} is stored externally but names no file (no 'location')")
        target = (file.parent / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(base):
            raise RematError(f"{where}: its external data {location!r} is outside the model's folder; refused")
        if not target.exists():
            raise RematError(f"{where}: its external data file {location!r} is missing")
        if not target.is_file():
            raise RematError(f"{where}: its external data {location!r} is not a regular file")
        try:
            offset = int(entries.get("offset") or 0)
            length = int(entries["length"]) if entries.get("length") else 0
        except ValueError:
            raise RematError(f"{where}: external data offset/length are not integers") from None
        if offset < 0 or length < 0:
            raise RematError(f"{where}: negative external data offset or length")
        out[target] = max(out.get(target, 0), offset + length)
    for target, need in out.items():
        have = target.stat().st_size
        if have < need:
            raise RematError(
                f"{file}: external data file {target.name} has {have} bytes, its tensors need {need} (truncated?)"
            )
    return list(out)


# -- the outputs of one command --------------------------------------------------------------------


@dataclass
class _Protected:
    path: Path  # resolved
    is_dir: bool
    label: str  # how the command line calls it: "MODEL", "--baseline", ...


@dataclass
class OutputSession:
    """The inputs and outputs of one command; see :func:`output_session`."""

    force: bool = False
    inputs: list[_Protected] = field(default_factory=list)
    claimed: dict[Path, tuple[str, bool]] = field(default_factory=dict)  # resolved -> (option, is_dir)
    created: list[Path] = field(default_factory=list)  # outputs written that did not exist before

    def add_input(self, path: str | os.PathLike | None, label: str = "input") -> None:
        """Protect ``path`` (a file, or a folder and everything in it) from being written."""
        if path is None or str(path) == "-":
            return
        p = Path(path)
        try:
            if not p.exists():
                return
            resolved = p.resolve()
        except OSError:
            return
        if any(i.path == resolved for i in self.inputs):
            return
        self.inputs.append(_Protected(resolved, p.is_dir(), label))

    def claim(
        self,
        path: str | os.PathLike | None,
        option: str,
        *,
        force: bool | None = None,
        is_dir: bool = False,
        parents: bool = False,
    ) -> Path | None:
        """Check an output path before any work is done; returns it (None for None or ``-``).

        Raises :class:`UsageError` (exit status 2) for a path that is an input of the command,
        lies inside an input folder, or is claimed twice; :class:`RematError` (1) for an existing
        output without ``force``, a missing or read-only folder. The write itself checks again.
        """
        if path is None or str(path) == "-":
            return None
        out = Path(path)
        force = self.force if force is None else force
        check_output(out, force=force, is_dir=is_dir, option=option, parents=parents)
        key = _resolved(out)
        for other, (other_option, other_is_dir) in self.claimed.items():
            if other == key:
                raise UsageError(f"{out}: given as {other_option} and as {option}; give two different paths")
            if other_is_dir and key.is_relative_to(other):
                raise UsageError(f"{out} ({option}) is inside {other_option}'s output folder; write it elsewhere")
            if is_dir and other.is_relative_to(key):
                raise UsageError(f"{option} {out} would hold the output of {other_option}; write it elsewhere")
        self.claimed[key] = (option, is_dir)
        return out

    def _rollback(self) -> None:
        with critical():
            for path in reversed(self.created):
                _remove(path)
            self.created.clear()


_SESSION: contextvars.ContextVar[OutputSession | None] = contextvars.ContextVar("onnx_remat_outputs", default=None)


@contextmanager
def output_session(
    inputs: Mapping[str, str | os.PathLike | None] | None = None, *, force: bool = False
) -> Iterator[OutputSession]:
    """The outputs of one command: ``inputs`` (``{label: path}``) are never written, whatever ``force``.

    Inside the block, :func:`load_model` adds every file it reads to the inputs, and every
    writer here checks its path against them and records what it created. When the block ends
    with an exception (a failed write, an error, Ctrl-C or SIGTERM) the outputs written in it
    are removed again; ``force``-replaced ones stay replaced.
    """
    session = OutputSession(force=force)
    for label, path in (inputs or {}).items():
        session.add_input(path, label)
    token = _SESSION.set(session)
    try:
        yield session
    except BaseException:
        session._rollback()
        raise
    finally:
        _SESSION.reset(token)


def make_parents(path: str | os.PathLike) -> None:
    """Create the missing folders above ``path`` (``check --update-baseline`` into a new folder).

    Within an :func:`output_session` they count as outputs: removed again if the command fails.
    Raises :class:`RematError` when one cannot be made (a file in the way, a read-only place)."""
    missing = []
    parent = Path(path).parent
    while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        try:
            with critical():
                folder.mkdir()
                _record_created(folder)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _write_error(folder, exc) from None


def note_input(path: str | os.PathLike, label: str = "input") -> None:
    """Within an :func:`output_session`: ``path`` is read by the command, so no output may replace it."""
    session = _SESSION.get()
    if session is not None:
        session.add_input(path, label)


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except OSError:
        return Path(os.path.abspath(p))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _looks_replaceable_dir(p: Path) -> bool:
    try:
        return (p / TRAINING_MODEL).is_file() or not any(p.iterdir())
    except OSError:
        return False


def check_output(
    out: str | os.PathLike,
    *,
    force: bool = False,
    is_dir: bool = False,
    inputs: tuple[str | os.PathLike, ...] = (),
    option: str = "output",
    parents: bool = False,
) -> Path:
    """Raise a one-line error unless ``out`` can be written; returns it as a Path.

    ``parents``: missing folders above ``out`` will be made (:func:`make_parents`).

    Refused whatever ``force`` says: a path that is an input of the command (``inputs``, and
    those of the current :func:`output_session`: same file, a file inside an input folder, a
    folder holding an input), a path whose folder is missing, not a folder or read-only.
    Refused without ``force``: an existing path. With ``force``: a file where a folder goes or
    the other way round, and a folder that is neither empty nor an artifacts directory.
    """
    out = Path(out)
    if out.name in ("", ".", ".."):
        raise UsageError(f"{option} {str(out)!r}: give a file or folder name, not {str(out)!r}")
    protected = []
    session = _SESSION.get()
    if session is not None:
        protected.extend(session.inputs)
        if option == "output":  # name the option the user gave this path with, where claimed
            option = session.claimed.get(_resolved(out), (option, False))[0]
    for given in inputs:
        if given is not None and Path(given).exists():
            protected.append(_Protected(_resolved(Path(given)), Path(given).is_dir(), "input"))
    target = _resolved(out)
    exists = out.exists() or out.is_symlink()
    for p in protected:
        what = {"MODEL": "the model", "input": "an input"}.get(p.label, f"an input of this command ({p.label})")
        if target == p.path or (exists and _same_file(out, p.path)):
            raise UsageError(f"{out}: this is {what}; give another path for {option}")
        if p.is_dir and target.is_relative_to(p.path):
            where = {"MODEL": f"the model's folder {p.path.name}/", "input": f"the input folder {p.path.name}/"}.get(
                p.label, f"{p.path.name}/, given as {p.label}"
            )
            raise UsageError(f"{out}: inside {where}; write {option} elsewhere")
        if exists and p.path.is_relative_to(target):
            raise UsageError(f"{out}: holds {p.path.name}, {what}; give another path for {option}")
    parent = out.parent
    if parents:  # the folders to be made: the nearest one that exists is what must be writable
        while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
            parent = parent.parent
    if not parent.exists():
        raise RematError(f"{out}: no such directory {str(parent)!r}; create it first")
    if not parent.is_dir():
        raise RematError(f"{out}: {str(parent)!r} is not a directory")
    if exists:
        if not force:
            raise RematError(f"{out}: already exists; give --force to replace it (force=True in Python)")
        if out.is_dir() and not is_dir:
            raise RematError(f"{out}: is a directory; give a file path for {option}")
        if is_dir and not out.is_dir():
            raise RematError(f"{out}: is a file; the output is an artifacts directory")
        if is_dir and not _looks_replaceable_dir(out):
            raise RematError(
                f"{out}: a directory that is not an artifacts directory (no {TRAINING_MODEL}); not replaced, even "
                "with --force"
            )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RematError(f"{out}: cannot write ({_why_not_writable(parent)})")
    return out


def _why_not_writable(folder: Path) -> str:
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def _write_error(out: Path, exc: OSError) -> RematError:
    """One line for an OSError met while writing ``out``."""
    if isinstance(exc, FileExistsError):
        return RematError(f"{out}: already exists (written by another process meanwhile); give --force to replace it")
    words = {
        errno.ENOENT: "cannot create files there",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "not permitted",
        errno.EISDIR: "is a directory",
        errno.ENAMETOOLONG: "file name too long",
        errno.EXDEV: "cannot rename across file systems",
    }
    why = words.get(exc.errno or -1) or exc.strerror or one_line(exc)
    return RematError(f"{out}: cannot write ({why})")


# -- exclusive rename ----------------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_renameat2_fn = None
_renameat2_looked_up = False


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done, False where this kernel, libc or file system
    lacks it (the caller falls back); OSError for anything else (EEXIST: ``dst`` exists)."""
    global _renameat2_fn, _renameat2_looked_up
    if not _renameat2_looked_up:
        _renameat2_looked_up = True
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2_fn = fn
        except (OSError, AttributeError):
            _renameat2_fn = None
    if _renameat2_fn is None:
        return False
    if _renameat2_fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _commit(tmp: Path, out: Path, *, force: bool, is_dir: bool) -> bool:
    """Rename ``tmp`` to ``out``. Without ``force`` only while ``out`` does not exist (atomically:
    FileExistsError otherwise). Returns True when ``out`` was created, False when replaced."""
    if force and (out.exists() or out.is_symlink()):
        if not is_dir:
            os.replace(tmp, out)
        elif not _renameat2(tmp, out, _RENAME_EXCHANGE):
            aside = tmp.with_name(tmp.name + ".old")
            os.rename(out, aside)
            os.rename(tmp, out)
            tmp = aside
        if is_dir:  # tmp now holds the old folder
            shutil.rmtree(tmp, ignore_errors=True)
        return False
    try:
        if _renameat2(tmp, out, _RENAME_NOREPLACE):
            return True
    except FileExistsError:
        if force:  # created by someone else since the check: replace it as asked
            return _commit(tmp, out, force=True, is_dir=is_dir)
        raise
    if is_dir:
        # mkdir claims the name (fails when it exists), then the folder is renamed onto the
        # empty one just made, which POSIX rename allows.
        os.mkdir(out)
        try:
            os.rename(tmp, out)
        except OSError:
            os.rmdir(out)
            raise
        return True
    try:
        os.link(tmp, out)  # fails when the name exists
    except FileExistsError:
        raise
    except OSError:  # no hard links on this file system: claim the name with O_EXCL, then replace it
        os.close(os.open(out, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.replace(tmp, out)
        return True
    os.unlink(tmp)
    return True


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def _temporary(out: Path, *, is_dir: bool) -> Iterator[Path]:
    """A temporary file or folder beside ``out``, with the permissions a plain ``open()`` or
    ``mkdir()`` would give (mkstemp/mkdtemp make 0600/0700), removed however the block ends."""
    tmp: Path | None = None
    try:
        with critical():  # a signal between creating and recording the name would leak it
            try:
                if is_dir:
                    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
                    os.chmod(tmp, 0o777 & ~_umask())
                else:
                    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
                    os.close(fd)
                    tmp = Path(name)
                    os.chmod(tmp, 0o666 & ~_umask())
            except OSError as exc:
                raise _write_error(out, exc) from None
        yield tmp
    finally:
        if tmp is not None:
            with critical():
                _remove(tmp)


def _record_created(path: Path) -> None:
    session = _SESSION.get()
    if session is not None:
        session.created.append(path)


def write_file(path: str | os.PathLike, data: str | bytes, *, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically and exclusively; returns the path.

    An existing ``path`` is replaced only with ``force``; an input of the command never
    (:func:`check_output`). Raises :class:`RematError` with one line when the folder is
    missing, read-only or full.
    """
    out = check_output(Path(path), force=force)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with _temporary(out, is_dir=False) as tmp:
        try:
            with open(tmp, "wb") as fh:
                fh.write(raw)
                fh.flush()
                os.fsync(fh.fileno())
            check_output(out, force=force)  # an input read since the first check
            with critical():
                if _commit(tmp, out, force=force, is_dir=False):
                    _record_created(out)
        except OSError as exc:
            raise _write_error(out, exc) from None
    return out


def _write_model_into(model: onnx.ModelProto, folder: Path, name: str, external_data: bool) -> list[str]:
    """Write ``model`` as ``folder/name`` (+ ``name.data`` with external data); returns the names written."""
    if not external_data:
        # onnx.save_model given a path walks every tensor to write external data (none here:
        # load_model read it all in); the bytes it would write are these.
        with open(folder / name, "wb") as f:
            f.write(model.SerializeToString())
        return [name]
    location = name + ".data"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save moves tensor bytes out of the message it is given
    for t in _all_tensors(copy):
        if t.data_location == onnx.TensorProto.EXTERNAL:  # not loaded: would be written as a stale reference
            raise RematError(f"{name}: tensor {t.name!r} refers to external data that was not loaded")
    # onnx checks the location against the *current* directory unless given the folder: chdir-free
    # by converting first, then writing the tensors next to the model file.
    onnx.external_data_helper.convert_model_to_external_data(
        copy, all_tensors_to_one_file=True, location=location, size_threshold=1024
    )
    onnx.external_data_helper.write_external_data_tensors(copy, str(folder))
    onnx.save_model(copy, str(folder / name))
    if not (folder / location).exists():  # every tensor was small
        return [name]
    os.chmod(folder / location, 0o666 & ~_umask())  # onnx creates it 0600
    return [name, location]


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    force: bool = False,
    inputs: tuple[str | os.PathLike, ...] = (),
    external_data: bool | None = None,
) -> Path:
    """Write ``model`` to ``path`` atomically and exclusively; returns the path.

    ``inputs`` are the files the model was made from: they are never written, ``force`` or not.
    An existing output is replaced only with ``force``. Tensors go to an external data file
    ``<name>.data`` beside it when ``external_data`` is True, or (by default) when the model is
    too large for one protobuf message; that file is an output too (checked, never silently
    replaced).
    """
    out = check_output(Path(path), force=force, inputs=inputs)
    if external_data is None:
        external_data = model.ByteSize() >= _PROTOBUF_LIMIT
    data_out = out.with_name(out.name + ".data")
    if external_data:
        check_output(data_out, force=force, inputs=inputs, option="external data")
    with _temporary(out, is_dir=True) as tmpdir:
        try:
            names = _write_model_into(model, tmpdir, out.name, external_data)
            check_output(out, force=force, inputs=inputs)
            with critical():
                created: list[Path] = []
                try:
                    # the data first: the model is never there without it
                    if len(names) > 1 and _commit(tmpdir / names[1], data_out, force=force, is_dir=False):
                        created.append(data_out)
                    if _commit(tmpdir / out.name, out, force=force, is_dir=False):
                        created.append(out)
                except BaseException:
                    for p in created:
                        _remove(p)
                    raise
                for p in created:
                    _record_created(p)
        except OSError as exc:
            raise _write_error(out, exc) from None
        except ValueError as exc:  # onnx's own checks on file names
            raise RematError(f"{out}: cannot write: {one_line(exc)}") from None
    return out


def write_artifacts(
    src_dir: str | os.PathLike,
    dst_dir: str | os.PathLike,
    training_model: onnx.ModelProto,
    *,
    force: bool = False,
    external_data: bool | None = None,
) -> Path:
    """Write a complete artifacts directory: ``training_model`` plus everything else of ``src_dir``.

    The checkpoint, eval and optimizer models (and any other regular files and folders) are
    copied unchanged, so onnxruntime-training's ``Module`` loads the result like the original.
    The new directory is assembled beside ``dst_dir`` and renamed into place, exclusively; an
    existing ``dst_dir`` is replaced only with ``force`` (and only when it is an artifacts
    directory or empty); ``src_dir``, a folder inside it or one holding it, never.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    dst = check_output(dst, force=force, is_dir=True, inputs=(src,))
    try:
        items = sorted(src.iterdir())  # listed before the temporary exists
    except OSError as exc:
        raise RematError(f"{src}: cannot read ({exc.strerror})") from None
    for item in items:
        if not (item.is_file() or item.is_dir()):
            raise RematError(f"{item}: not a regular file or folder; refusing to copy it")
    if external_data is None:
        external_data = training_model.ByteSize() >= _PROTOBUF_LIMIT
    with _temporary(dst, is_dir=True) as tmp:
        try:
            for item in items:
                if item.name == TRAINING_MODEL or item.name.startswith(TRAINING_MODEL + "."):
                    continue  # the training graph (and its external data) is rewritten below
                if item.is_dir():
                    shutil.copytree(item, tmp / item.name)
                else:
                    shutil.copy2(item, tmp / item.name)
            _write_model_into(training_model, tmp, TRAINING_MODEL, external_data)
            check_output(dst, force=force, is_dir=True, inputs=(src,))
            with critical():
                if _commit(tmp, dst, force=force, is_dir=True):
                    _record_created(dst)
        except OSError as exc:
            raise _write_error(dst, exc) from None
        except shutil.Error as exc:
            raise RematError(f"{dst}: cannot copy {src}: {one_line(exc)}") from None
    return dst


def save_derived(
    source: LoadedModel | None, model: onnx.ModelProto, out: str | os.PathLike, *, force: bool = False
) -> Path:
    """Write ``model``, a graph derived from ``source`` (a rewrite or a new order of it), to ``out``
    atomically; returns where.

    From an artifacts directory the output is a complete artifacts directory (checkpoint, eval and
    optimizer models copied) unless ``out`` ends in ``.onnx``; otherwise a model file, with the
    source's external data. Replacing an existing output needs ``force``; the source's files are
    never replaced (:func:`check_output`). ``source`` None: a model given in memory.
    """
    out = Path(out)
    if source is None:
        return save_model(model, out, force=force)
    inputs = tuple(source.files or [source.path]) + tuple(
        p for p in (source.eval_model_path, source.checkpoint_path, source.artifacts_dir) if p is not None
    )
    external = source.external_data or None
    if source.artifacts_dir is not None and out.suffix != ".onnx":
        return write_artifacts(source.artifacts_dir, out, model, force=force, external_data=external)
    return save_model(model, out, force=force, inputs=inputs, external_data=external)


def remat_output(
    model: str | os.PathLike, output: str | os.PathLike | None = None, *, kind: str = "remat"
) -> tuple[Path, bool]:
    """Where ``apply`` writes the rewrite of ``model`` (``schedule``, with ``kind="scheduled"``, its
    reordering), and whether that is an artifacts directory.

    ``output`` as given, else in the current directory (never beside the input, which may be
    read-only or a folder that tests and git look at): ``<artifacts>_remat/`` for an artifacts
    directory, ``<name>.remat.onnx`` for a model file (``kind`` in place of ``remat``). From an
    artifacts directory a path ending in ``.onnx`` is a model file.
    """
    file, artifacts_dir = find_model_file(model)
    if output is None:
        if artifacts_dir is not None:
            out = Path(f"{artifacts_dir.resolve().name}_{kind}")
        else:
            out = Path(f"{file.name.removesuffix('.onnx')}.{kind}.onnx")
    else:
        out = Path(output)
    return out, artifacts_dir is not None and out.suffix != ".onnx"


def forward_only_hint(path: Path | None) -> str:
    """What to say after "a forward-only graph": the training graph beside an artifacts
    ``eval_model.onnx``, else how to make one."""
    beside = path.parent / TRAINING_MODEL if path is not None else None
    if beside is not None and beside.is_file() and beside.resolve() != path.resolve():  # type: ignore[union-attr]
        return f"give the training graph beside it, {beside}"
    return (
        "make a training graph first, e.g. with onnxruntime.training.artifacts.generate_artifacts(model, "
        "requires_grad=[...], loss=...)"
    )


def symbolic_dims(model: onnx.ModelProto) -> list[str]:
    """The names of the symbolic dimensions (``dim_param``) in the graph's inputs, outputs and
    value infos, in order of appearance."""
    seen: dict[str, None] = {}
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param:
                    seen.setdefault(d.dim_param, None)
    return list(seen)


def check_dim_names(model: onnx.ModelProto, dims: Mapping[str, int] | None, name: str = "the model") -> None:
    """Raise :class:`UsageError` for a ``--dim`` whose name is no symbolic dimension of ``model``
    (a typo would otherwise be ignored silently)."""
    if not dims:
        return
    known = symbolic_dims(model)
    unknown = [k for k in dims if k not in known]
    if unknown:
        has = f"its symbolic dimensions are {', '.join(known)}" if known else "it has none (every size is fixed)"
        s = "s" if len(unknown) > 1 else ""
        raise UsageError(f"--dim {', '.join(unknown)}: {name} has no symbolic dimension{s} of that name; {has}")
