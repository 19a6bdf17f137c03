"""The writer's work file ``<output>.partial``: one writer at a time, safe to kill, published by rename.

The writer opens the work file in HDF5's single-writer/multiple-reader (SWMR) mode, which
orders HDF5's own writes so that the file on disk is valid at every moment: a writer killed
at any point (SIGKILL; not a power cut) leaves a file that can be read. HDF5 then refuses to
open that file for writing again (its superblock still says "open for write"; the ``h5clear``
tool would reset that), so the next writer copies what the killed one had committed into a
fresh work file (``new_file``) and continues there. New files are built under a staging name
and renamed, so the work file itself is never half-made.

``/committed`` is set only after the regions and index rows of a batch are flushed, so the
images below it are whole whichever write the kill interrupted.
"""
from __future__ import annotations

import os
from pathlib import Path

import h5py

from . import layout
from .errors import RegionFeatureError
from .store import open_hdf5

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one writer per output is then the user's to ensure
    fcntl = None

#: Rows of /features and /boxes copied per step (32 MiB of 2048-d float16).
COPY_ROWS = 8192


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target`` once its bytes are on disk (and the rename too)."""
    fsync(source)
    os.replace(source, target)
    fsync(target.parent)


def staging_path(partial: Path) -> Path:
    """Where a new work file is built before it is renamed to ``partial``."""
    return partial.with_name(partial.name + ".new")


class WriterLock:
    """An exclusive advisory lock on ``<partial>.lock``, held while a writer works on ``partial``:
    a second writer of the same output is refused instead of writing the same file."""

    def __init__(self, partial: Path):
        self.path = partial.with_name(partial.name + ".lock")
        self._fd = None

    def acquire(self) -> None:
        if fcntl is None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RegionFeatureError(f"{self.path}: another process is writing this output; wait for it to finish "
                                     f"(or stop it: a re-run resumes its work)") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def open_for_writing(path: Path) -> h5py.File:
    """``path`` opened straight into SWMR write mode (no moment in plain write mode, whose
    interruption would leave a file HDF5 can no longer open)."""
    access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    access.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_LATEST)  # layout.LIBVER
    return h5py.File(h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_WRITE, fapl=access))


def open_killed(partial: Path) -> h5py.File:
    """The work file of a writer that was killed, for reading."""
    try:
        return h5py.File(partial, "r", swmr=True, libver=layout.LIBVER)
    except OSError as err:
        raise RegionFeatureError(f"{partial}: the work file of an interrupted conversion cannot be read ({err}); "
                                 f"delete it and re-run the command to start over") from err


def new_file(staging: Path, feature_dim: int, dtype, chunk_rows: int, sources: str, options: str,
             source: h5py.File = None, complete: bool = False) -> None:
    """Build a file at ``staging``: empty, or holding the committed images of ``source``;
    ``sources`` and ``options`` are the JSON records of the inputs and options; ``complete``
    marks it finished."""
    with open_hdf5(staging, "w", libver=layout.LIBVER) as file:
        layout.create(file, feature_dim, dtype, chunk_rows)
        file[layout.SOURCES][()] = sources
        file.attrs[layout.OPTIONS] = options
        if source is not None:
            copy_images(source, file, layout.committed(source))
        if complete:
            file.attrs.update({layout.COMPLETE: True, layout.NUM_IMAGES: layout.committed(file)})


def copy_images(source: h5py.File, target: h5py.File, count: int) -> None:
    """Copy the first ``count`` images of ``source`` (index rows, names and origins if it has
    them, and their regions) into the empty ``target`` (``layout.create``), and commit them."""
    end = 0
    if count:
        end = int(source[layout.FIRST_REGION][count - 1] + source[layout.NUM_REGIONS][count - 1])
    for name in layout.INDEX:
        target[name].resize(count, axis=0)
        if name in source:  # a version-1 file has no names or origins: they stay "" (unknown)
            target[name][:] = source[name][:count]
    for name in (layout.FEATURES, layout.BOXES):
        target[name].resize(end, axis=0)
        for start in range(0, end, COPY_ROWS):
            stop = min(start + COPY_ROWS, end)
            target[name][start:stop] = source[name][start:stop]
    target[layout.COMMITTED][0] = count
