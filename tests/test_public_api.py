"""The public API is small, listed in __all__, resolvable, and cheap to import."""

import subprocess
import sys

import spotwise


def test_all_lists_exactly_the_lazy_exports():
    assert set(spotwise.__all__) == {"__version__", *spotwise._EXPORTS}


def test_every_public_name_resolves():
    for name in spotwise.__all__:
        assert getattr(spotwise, name) is not None, name
    assert spotwise.EXIT_INTERRUPTED == 75
    assert issubclass(spotwise.SpotwiseError, Exception)


def test_unknown_attribute_is_an_attribute_error():
    try:
        spotwise.NoSuchThing  # noqa: B018
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("expected AttributeError")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print('\\n'.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return set(out.split())


def test_import_spotwise_and_cli_do_not_load_torch_or_cloud_sdks():
    loaded = _modules_after("import spotwise, spotwise.cli.main")
    assert not {"torch", "boto3", "botocore", "cryptography", "matplotlib"} & loaded


def test_runtime_imports_no_cloud_sdk():
    loaded = _modules_after("import spotwise; spotwise.Run")
    assert "torch" in loaded
    assert not {"boto3", "botocore", "cryptography", "matplotlib"} & loaded
