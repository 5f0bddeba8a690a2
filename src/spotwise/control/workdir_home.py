"""Where a job's packed workdir is stored, decided at submit from its provider's features:
beside its checkpoints when the controller can write there, refused before the job exists when
it cannot. Apart from ``workdir`` (packing and unpacking, which providers' bootstraps import)
because it reads the provider protocol's ``Features``.
"""

from __future__ import annotations

from pathlib import Path

from spotwise.control.providers.base import Features
from spotwise.control.workdir import ARCHIVES, split_workdir, store_uploaded, submit_archive
from spotwise.errors import ConfigError


def archive_home(features: Features, checkpoint_dir: str | None, local: Path) -> str | None:
    """The store a job's archives go to, beside its checkpoints: ``local`` (the controller's
    ``$SPOTWISE_HOME/workdirs``) where the machines share the controller's disk, else
    ``workdirs/`` next to the job's object-store checkpoint directory; None where the
    controller cannot write what the machines read (a cluster's volume)."""
    if features.checkpoints is None:
        return str(local)
    where = checkpoint_dir or features.checkpoints.default
    if where is None or "://" not in where:
        return None
    if "{job_id}" in where:  # the provider's default: the folder of every job's folder
        return f"{where.split('/{job_id}', 1)[0].rstrip('/')}/{ARCHIVES}"
    scheme, rest = where.rstrip("/").split("://", 1)
    parent = rest.rsplit("/", 1)[0] if "/" in rest else rest
    return f"{scheme}://{parent}/{ARCHIVES}"


def submit_workdir(
    workdir: str,
    features: Features,
    checkpoint_dir: str | None,
    local: Path,
    provider: str,
    *,
    upload: bool = True,
    uploaded: str | None = None,
) -> str | None:
    """At submit: a ``pack:`` workdir packed and stored (what the job store keeps as
    ``workdir_archive``); None for any other workdir. Refused, before the job exists, when
    over the limit or when the provider's machines read no store the controller can write.
    ``uploaded``: the sha256 of the archive a server's client packed and uploaded to
    ``local``, stored in place of packing ``PATH`` (which is on the client's machine)."""
    kind, path = split_workdir(workdir)
    if kind != "pack":
        return None
    home = archive_home(features, checkpoint_dir, local)
    if home is None:
        raise ConfigError(
            f"workdir: {workdir!r}: the {provider} machines read checkpoints from a volume "
            "the controller cannot write, so the packed code could not reach them",
            hint="give checkpoint_dir as an s3:// URI (the archive goes beside it), or put "
            "the code on the image and write workdir: remote:/path/in/the/image",
        )
    if uploaded is not None:
        return str(store_uploaded(uploaded, local, home))
    return str(submit_archive(Path(path), home, upload=upload))
