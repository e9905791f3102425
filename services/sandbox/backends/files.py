"""Files in and out of sandboxes. Whatever a sandbox holds is untrusted: an agent can leave symlinks, hard links,
FIFOs, device files or ``../`` paths behind.

- Out: tar archives extracted with the ``data`` filter (an unsafe member is skipped).
- In (:func:`seal_in`, on this machine's disk): the source is first copied into a fresh staging folder the sandbox
  cannot see, then renamed into place; every folder on the way is opened with ``O_NOFOLLOW`` relative to the one
  before it, and whatever stands at the target (a link, a file, a folder the agent filled) is removed, never
  written through. A link, hard link or special file the agent planted is replaced, never followed; a special file
  in the source (a FIFO would block the copy for ever) is skipped and reported.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from services.sandbox.errors import SandboxError


def tar_of(source: Path, name: str) -> bytes:
    """A tar archive holding ``source`` (a file or a folder) under the name ``name``."""
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(str(source), arcname=name)
    return buffer.getvalue()


def _safe_member(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """The ``data`` filter, but an unsafe member (absolute or escaping link, device file) is skipped, not fatal:
    one planted link must not lose the rest of a trial's logs."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None


def extract_tar(fileobj: IO[bytes], scratch: Path, name: str, target: Path) -> None:
    """Extract an archive holding ``name`` into ``scratch``, then move it to ``target`` (replacing it)."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as archive:
            archive.extractall(scratch, filter=_safe_member)
    except tarfile.TarError as e:
        raise SandboxError(f"the archive of {name} from the sandbox is cut short or damaged ({e})") from None
    extracted = scratch / name
    if not (extracted.exists() or extracted.is_symlink()):
        raise SandboxError(
            f"{name} is a link that leads out of the sandbox, or a special file: it is not copied out of it"
        )
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(extracted), str(target))


def folder_digest(folder: Path) -> str:
    """sha256 over every file's relative path, mode and bytes: equal folders give equal digests."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        relative = path.relative_to(folder).as_posix()
        content = f"->{path.readlink()}".encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"{relative}\0{path.lstat().st_mode & 0o777:o}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_STAGED = "staged"


def seal_in(source: Path, base: Path, parts: Sequence[str], *, merge: bool = False) -> list[str]:
    """Put ``source`` (a file, a link or a folder of this machine) at ``base/parts…`` without following anything
    the sandbox left on the way: ``base`` is a folder of the sandbox's record that the sandbox itself cannot see
    (staging happens in a fresh folder inside it, so the final step is a rename on one filesystem).

    A folder ``source`` replaces what is at the target; with ``merge`` its entries go into the folder there (each
    entry replaced whole, folders merged the same way: Docker's ``COPY`` of a folder). A folder or a link in the
    way of a folder on the path is replaced by a new folder.

    Returns:
        The special files of ``source`` that were skipped (relative paths).

    Raises:
        SandboxError: ``parts`` is empty or names ``.``/``..``, or the copy failed.
    """
    if not parts or any(part in ("", ".", "..") or "/" in part for part in parts):
        raise SandboxError(f"cannot place a file at {'/'.join(parts)!r}: each part must be one plain name")
    staging = Path(tempfile.mkdtemp(prefix=".stage-", dir=base))
    skipped: list[str] = []
    try:
        _stage(source, staging / _STAGED, Path(source.name), skipped)
        stage_fd = os.open(staging, _DIR_FLAGS)
        fd = os.open(base, _DIR_FLAGS)
        try:
            for name in parts[:-1]:
                fd = _descend(fd, name)
            _put(stage_fd, _STAGED, fd, parts[-1], merge)
        finally:
            os.close(fd)
            os.close(stage_fd)
    except OSError as e:
        raise SandboxError(f"cannot place {source} at {'/'.join(parts)} in the sandbox: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return skipped


def _stage(source: Path, dest: Path, relative: Path, skipped: list[str]) -> None:
    """Copy ``source`` to the fresh ``dest``: folders, regular files and links (as links); nothing else."""
    mode = os.lstat(source).st_mode
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(source), dest)
    elif stat.S_ISDIR(mode):
        os.mkdir(dest)
        with os.scandir(source) as entries:
            for entry in entries:
                _stage(Path(entry.path), dest / entry.name, relative / entry.name, skipped)
        shutil.copystat(source, dest, follow_symlinks=False)
    elif stat.S_ISREG(mode):
        shutil.copy2(source, dest, follow_symlinks=False)
    else:
        skipped.append(relative.as_posix())


def _descend(fd: int, name: str) -> int:
    """The folder ``name`` in the folder ``fd`` (which is closed), made when missing; whatever else is there (a
    link, a file) is removed first. Never follows a link."""
    try:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            _remove(fd, name)
        os.mkdir(name, 0o755, dir_fd=fd)
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def _remove(fd: int, name: str) -> None:
    """Remove the entry ``name`` of the folder ``fd`` whatever it is, following no link."""
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def _put(src_fd: int, src: str, dst_fd: int, name: str, merge: bool) -> None:
    """Rename the staged entry ``src`` to ``name``; with ``merge``, a staged folder goes into a folder there entry by
    entry."""
    src_mode = os.stat(src, dir_fd=src_fd, follow_symlinks=False).st_mode
    if merge and stat.S_ISDIR(src_mode):
        with contextlib.suppress(FileNotFoundError):
            dst_mode = os.stat(name, dir_fd=dst_fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(dst_mode):
                inner_src = os.open(src, _DIR_FLAGS, dir_fd=src_fd)
                inner_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
                try:
                    for entry in os.listdir(inner_src):
                        _put(inner_src, entry, inner_dst, entry, merge)
                finally:
                    os.close(inner_src)
                    os.close(inner_dst)
                return
    _remove(dst_fd, name)
    os.rename(src, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
