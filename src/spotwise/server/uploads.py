"""A remote client's packed workdir, received: ``PUT /api/v1/workdirs/{sha256}``.

A client on another machine packs its ``workdir: pack:PATH`` itself (the server cannot read
the client's disk) and uploads the archive before submitting the job with its digest. The
body is streamed to a private temporary file beside the archives while it is hashed, cut at
:data:`UPLOAD_LIMIT`, and kept only when its sha256 is the one in the URL and every member
would be unpacked (the machines' own checks, ``checked_members``). It is then renamed to
``<sha256>.tar.gz`` in ``$SPOTWISE_HOME/workdirs``, where the embedded mode stores what it
packs: the same digest uploaded twice, or by two users, is one file, and submit stores it
beside the job's checkpoints exactly as a locally packed one.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import tarfile
import tempfile
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

from spotwise.control.workdir import MAX_BYTES, SHA256, CodeArchive, checked_members
from spotwise.errors import ConfigError

# compressed, so at most the files' limit plus tar's headers (512 bytes a file, padding)
UPLOAD_LIMIT = 2 * MAX_BYTES


class TooLarge(ConfigError):
    """The body went past :data:`UPLOAD_LIMIT` (answered 413)."""


def check_digest(sha256: str) -> None:
    if not SHA256.match(sha256):
        raise ConfigError(
            f"{sha256[:80]!r} is not a sha256 digest", hint="64 lowercase hexadecimal digits"
        )


def stored(uploads: Path, sha256: str) -> Path | None:
    """The uploaded archive of this digest, if the server has it."""
    check_digest(sha256)
    path = uploads / CodeArchive(str(uploads), sha256).key
    return path if path.is_file() else None


async def receive(body: AsyncIterator[bytes], sha256: str, uploads: Path) -> tuple[int, bool]:
    """Store the streamed archive as ``uploads/<sha256>.tar.gz`` once verified: (its size,
    whether it was new). Raises ``ConfigError`` (``TooLarge``) saying what was refused."""
    check_digest(sha256)
    uploads.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".upload-", suffix=".tar.gz", dir=uploads)
    tmp = Path(name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            async for chunk in body:
                size += len(chunk)
                if size > UPLOAD_LIMIT:
                    raise TooLarge(
                        f"the upload is over {UPLOAD_LIMIT // 2**20} MiB",
                        hint=f"a workdir holds at most {MAX_BYTES // 2**20} MiB of files: "
                        "leave out what the machine does not need with a .spotwiseignore",
                    )
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise ConfigError(
                f"the upload's sha256 is {digest.hexdigest()}, not {sha256} (cut short?)",
                hint="upload it again",
            )
        await asyncio.to_thread(verify, tmp)  # (reads it all: off the event loop)
        target = uploads / CodeArchive(str(uploads), sha256).key
        new = not target.exists()
        os.replace(tmp, target)  # same digest, same bytes: replacing one changes nothing
        return size, new
    finally:
        tmp.unlink(missing_ok=True)


def verify(archive: Path) -> None:
    """Refuse what a machine would refuse to unpack, before any job names it."""
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            checked_members(tar)
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise ConfigError(
            f"the upload is not a .tar.gz archive ({type(exc).__name__})",
            hint="upload what `spotwise launch` packs (a workdir: pack:PATH)",
        ) from None
