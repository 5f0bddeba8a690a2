"""Job secrets by reference (``env_from``): the job store keeps where a value is, never the value.

A job's ``env`` is stored with the job (and shown by ``spotwise status``), so a token written
there sits in plain text in the store. ``env_from`` names the place instead, and the value is
read where it is needed, as late as possible:

* ``{file: PATH}``: the file's content (one trailing newline dropped), read by the controller
  when an attempt starts (so a rotated token is picked up by the next attempt); any provider.
* ``{kubernetes_secret: NAME/KEY}``: a ``secretKeyRef`` in the pod spec; the kubelet reads it.
* ``{aws_ssm: PARAMETER}`` / ``{aws_secret: SECRET_ID}``: fetched on the EC2 instance by its
  bootstrap (``python -m spotwise.control.secret_refs``) with the instance profile's rights,
  so the value is in neither the store nor the user-data.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from spotwise.echo import printable
from spotwise.errors import ConfigError

MAX_SECRET_BYTES = 65536  # an environment value (one argument may be 128 KiB on Linux)
# The provider that resolves each kind of reference on its machines; None: the controller does.
RESOLVED_BY: dict[str, str | None] = {
    "file": None,
    "kubernetes_secret": "kubernetes",
    "aws_ssm": "aws",
    "aws_secret": "aws",
}
# Words of an env name that say its value is a credential (HF_TOKEN, WANDB_API_KEY, DB_PASSWORD).
_SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "APIKEY", "CREDENTIAL",
                 "CREDENTIALS", "AUTH", "PAT"}  # fmt: skip
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")  # a Secret's name (DNS)
_K8S_KEY = re.compile(r"[-._A-Za-z0-9]{1,253}\Z")  # a key in a Secret's data


class SecretRef(BaseModel):
    """Where one environment variable's value is; exactly one of the fields is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str | None = None
    kubernetes_secret: str | None = None  # "secret-name/key"
    aws_ssm: str | None = None  # an SSM parameter name (SecureString decrypted)
    aws_secret: str | None = None  # a Secrets Manager secret id or ARN (its SecretString)

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        given = [k for k in RESOLVED_BY if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(RESOLVED_BY)} "
                f"(given: {', '.join(given) or 'none'})"
            )
        if self.kubernetes_secret is not None:
            name, _, key = self.kubernetes_secret.partition("/")
            if not _K8S_NAME.match(name) or not _K8S_KEY.match(key):
                raise ValueError(
                    "kubernetes_secret is SECRET-NAME/KEY, e.g. hf-token/token "
                    "(kubectl create secret generic hf-token --from-file=token=...)"
                )
        if any(not v.strip() for v in (self.file, self.aws_ssm, self.aws_secret) if v is not None):
            raise ValueError(f"{self.kind} is empty")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in RESOLVED_BY if getattr(self, k) is not None)

    @property
    def where(self) -> str:
        value = getattr(self, self.kind)
        assert isinstance(value, str)
        return value


def check_refs(refs: Mapping[str, SecretRef], provider: str) -> None:
    """Every reference can be resolved for a job on ``provider``."""
    for name, ref in refs.items():
        owner = RESOLVED_BY[ref.kind]
        if owner is not None and owner != provider:
            raise ValueError(
                f"env_from.{name}: {ref.kind} is resolved by the {owner} provider, and this job "
                f"runs on {provider!r}; use {{file: PATH}} (read by the controller) instead"
            )


def missing_files(refs: Mapping[str, SecretRef]) -> list[str]:
    """``env_from.NAME: problem`` for file references that name no file now, checked when the
    job file is read (the content is read only when an attempt starts)."""
    return [
        f"env_from.{name}: {printable(ref.file)} is not a file; check the path"
        for name, ref in refs.items()
        if ref.file is not None and not Path(ref.file).is_file()
    ]


def read_secret_file(name: str, path: str) -> str:
    """The value of ``env_from: {name: {file: path}}``: the file's text, one trailing line
    break dropped (``echo $TOKEN > file`` adds it). Raises ConfigError naming the variable."""
    fix = f"env_from.{name}: {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{fix}: cannot read it ({exc.strerror})", hint="check the path") from (
            None
        )
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"{fix}: larger than {MAX_SECRET_BYTES // 1024} KiB; not one value")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{fix}: not UTF-8 text", hint="save the value as UTF-8") from None
    if "\x00" in text:
        raise ConfigError(f"{fix}: contains a NUL character, which no program can receive")
    return text.removesuffix("\n").removesuffix("\r")


def file_values(refs: Mapping[str, SecretRef], *, reveal: bool = True) -> dict[str, str]:
    """The controller's part: file references read now (or, without ``reveal``, a placeholder
    for ``launch --dry-run``, which prints what it would create)."""
    return {
        name: read_secret_file(name, ref.file) if reveal else f"<content of {ref.file}>"
        for name, ref in refs.items()
        if ref.file is not None
    }


def kubernetes_secret_env(refs: Mapping[str, SecretRef]) -> dict[str, str]:
    """``NAME: secret/key`` for the pod's ``secretKeyRef`` entries (as provider option
    ``secret_env`` writes them)."""
    return {n: r.kubernetes_secret for n, r in refs.items() if r.kubernetes_secret is not None}


def aws_fetch_script(refs: Mapping[str, SecretRef], python: str, region: str) -> str:
    """Bash lines for the instance's bootstrap that fetch the AWS references and export them;
    a failed fetch exits 1 (reported as the attempt's exit, with the reason in its log)."""
    lines = []
    for name, ref in sorted(refs.items()):
        if ref.aws_ssm is None and ref.aws_secret is None:
            continue
        fetch = shlex.join(
            [python, "-m", "spotwise.control.secret_refs", ref.kind, ref.where, "--region", region]
        )
        lines.append(f"{name}=$({fetch}) || exit 1")
        lines.append(f"export {name}")
    return "\n".join(lines)


def plain_secret_keys(env: Mapping[str, str]) -> list[str]:
    """The ``env`` names that look like credentials and carry a value (warned at launch)."""
    return sorted(
        k
        for k, v in env.items()
        if v and _SECRET_WORDS & set(re.split(r"_+", k.upper().replace("APIKEY", "API_KEY")))
    )


def fetch_aws(kind: str, where: str, region: str) -> str:
    """The value of an SSM parameter (decrypted) or a Secrets Manager secret, with the
    instance's own credentials (its instance profile)."""
    from spotwise.registry import require

    boto3 = require("boto3", "aws", "env_from with aws_ssm / aws_secret")
    if kind == "aws_ssm":
        ssm = boto3.client("ssm", region_name=region)
        value = ssm.get_parameter(Name=where, WithDecryption=True)["Parameter"]["Value"]
    else:
        sm = boto3.client("secretsmanager", region_name=region)
        value = sm.get_secret_value(SecretId=where)["SecretString"]
    return str(value)


def main(argv: list[str] | None = None) -> int:
    """``python -m spotwise.control.secret_refs aws_ssm NAME --region R``: print the value."""
    parser = argparse.ArgumentParser(prog="python -m spotwise.control.secret_refs")
    parser.add_argument("kind", choices=["aws_ssm", "aws_secret"])
    parser.add_argument("where")
    parser.add_argument("--region", required=True)
    args = parser.parse_args(argv)
    try:
        value = fetch_aws(args.kind, args.where, args.region)
    except Exception as exc:  # botocore's errors: one line in the attempt's log, never a value
        print(f"spotwise: cannot read {args.kind} {args.where!r}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
