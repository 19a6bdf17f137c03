"""scripts/convert_features.py: every subcommand converts its fixture; resumes, also after a SIGKILL;
publishes only complete stores; clear errors that leave no output (exit 2); a store matches its command's
options; FIFOs, pipes, process substitution, .tsv.gz and .zip members are read without unpacking."""
import contextlib
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from common.features import RegionFeatureError, RegionFeatureStore, layout
from common.features.fixtures import random_region_features, write_format_fixtures, write_random_features
from common.features.formats import bottom_up_tsv

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DIM = 8
IDS = [5, 3, 11]


def _load_script(name):
    return load_script(f"scripts/{name}.py")


convert_features = _load_script("convert_features")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return write_format_fixtures(tmp_path_factory.mktemp("cli"), IDS, num_regions=(2, 6), feature_dim=DIM)


def arguments(name, paths):
    if name == "selfcritical-npz":
        root = paths[name]
        return [name, "--att-dir", str(root / "cocobu_att"), "--box-dir", str(root / "cocobu_box"),
                "--image-info", str(root / "image_info.json")]
    return [name, str(paths[name])]


def options(output):
    return ["--output", str(output), "--feature-dim", str(DIM), "--quiet"]


@pytest.mark.parametrize("name", ["bottom-up-tsv", "lxmert-tsv", "selfcritical-npz", "mcan-npz"])
def test_cli_converts_and_resumes(tmp_path, fixtures, capsys, name):
    output = tmp_path / "out.h5"
    argv = arguments(name, fixtures) + options(output)
    assert convert_features.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 3, "skipped": 0, "images": 3,
                                                   "unchanged": False}
    with RegionFeatureStore(output) as store:
        for image_id in IDS:
            want = random_region_features(image_id, (2, 6), DIM)
            assert torch.equal(store[image_id].features, want.features)
            assert store[image_id].image_size == want.image_size
        assert {source["format"] for source in store.sources} >= {name}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.h5"]
    assert convert_features.main(argv) == 0  # the same command again: nothing to do, every image skipped
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 0, "skipped": 3, "images": 3,
                                                   "unchanged": True}


def test_cli_error_names_the_file(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert convert_features.main(["mcan-npz", str(missing), "--output", str(tmp_path / "o.h5"), "--quiet"]) == 2
    assert f"error: {missing}: no such directory of MCAN" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind, message", [("empty", "the file is empty (0 bytes)"), ("missing", "no such file"),
                                           ("folder", "is a directory, expected a bottom-up TSV file")])
def test_bad_input_paths_are_clean_errors_that_create_no_output(tmp_path, fixtures, capsys, kind, message):
    bad = tmp_path / "in"
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "folder":
        bad.mkdir()
    output = tmp_path / "out" / "out.h5"
    argv = ["bottom-up-tsv", str(fixtures["bottom-up-tsv"]), str(bad)] + options(output)
    assert convert_features.main(argv) == 2
    assert f"error: {bad}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_existing_output_needs_append_which_is_atomic(tmp_path, fixtures, capsys):
    output = tmp_path / "out.h5"
    assert convert_features.main(arguments("mcan-npz", fixtures) + options(output)) == 0
    before = output.read_bytes()
    more = bottom_up_tsv.write(tmp_path / "more.tsv", [random_region_features(i, (2, 6), DIM) for i in (20, 21)])
    argv = ["bottom-up-tsv", str(more)] + options(output)
    capsys.readouterr()
    assert convert_features.main(argv) == 2
    assert f"error: {output} already exists (3 images from {fixtures['mcan-npz']} (3 files" in capsys.readouterr().err
    assert output.read_bytes() == before
    assert convert_features.main(argv + ["--append"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 5
    store = RegionFeatureStore(output)
    assert sorted(store.image_ids) == sorted(IDS + [20, 21])
    assert [source["format"] for source in store.sources] == ["mcan-npz", "bottom-up-tsv"]
    assert torch.equal(store[21].features, random_region_features(21, (2, 6), DIM).features)
    assert convert_features.main(argv) == 0 and json.loads(capsys.readouterr().out)["unchanged"]


def test_mark_complete_makes_a_version_1_store_readable(tmp_path, capsys):
    path = write_random_features(tmp_path / "old.h5", [4, 5], feature_dim=DIM)
    with h5py.File(path, "a") as file:  # as layout version 1 wrote it
        for name in (layout.IMAGE_NAMES, layout.ORIGINS, layout.SOURCES, layout.COMMITTED):
            del file[name]
        del file.attrs[layout.COMPLETE], file.attrs[layout.NUM_IMAGES]
        file.attrs["version"] = 1
    with pytest.raises(RegionFeatureError, match="mark-complete"):
        RegionFeatureStore(path)
    assert convert_features.main(["mark-complete", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"marked_complete": {str(path): 2}}
    assert RegionFeatureStore(path).image_ids == [4, 5]


KILL_IMAGES = 1000
KILL_DIM = 32


def kill_after_two_batches(argv, partial) -> None:
    """Run the converter on ``argv`` and SIGKILL it once its partial store holds two committed batches
    (one batch, 8192 rows of 32-d float16 regions and their boxes, is about 0.65 MB)."""
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "convert_features.py"), *argv], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None and not (partial.exists() and partial.stat().st_size > 1_500_000):
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the conversion ended before it could be killed"


def test_a_conversion_killed_midway_is_refused_then_resumed(tmp_path, capsys):
    """SIGKILL once the work file holds a few batches: the output does not exist, the work file is
    refused as incomplete, and the same command resumes it (skipping what was stored) to a whole store."""
    tsv = bottom_up_tsv.write(tmp_path / "in.tsv",
                              (random_region_features(i, 36, KILL_DIM) for i in range(KILL_IMAGES)))
    output = tmp_path / "out.h5"
    partial = layout.partial_path(output)
    argv = ["bottom-up-tsv", str(tsv), "--output", str(output), "--feature-dim", str(KILL_DIM), "--quiet"]
    kill_after_two_batches(argv, partial)
    assert not output.exists()
    with pytest.raises(RegionFeatureError, match=r"out\.h5: not written yet: .*out\.h5\.partial; re-run the same "
                                                 r"command to resume"):
        RegionFeatureStore(output)
    with pytest.raises(RegionFeatureError, match=r"out\.h5\.partial: not marked complete: .* Re-run the same "
                                                 r"command to resume"):
        RegionFeatureStore(partial)
    assert convert_features.main(argv) == 0  # the same command, in this process
    counts = json.loads(capsys.readouterr().out)
    assert counts["images"] == KILL_IMAGES and counts["skipped"] > 0
    assert counts["written"] + counts["skipped"] == KILL_IMAGES
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.tsv", "out.h5"]
    store = RegionFeatureStore(output)
    assert store.image_ids == list(range(KILL_IMAGES))
    for image_id in range(0, KILL_IMAGES, 37):
        assert torch.equal(store[image_id].features, random_region_features(image_id, 36, KILL_DIM).features)


def test_a_rerun_with_other_options_is_refused_naming_each_until_overwrite(tmp_path, fixtures, capsys):
    """A store records its options: a re-run that differs is one line naming each difference; --overwrite
    rebuilds it; the same command again is a no-op that counts every image as skipped."""
    output = tmp_path / "out.h5"
    argv = arguments("lxmert-tsv", fixtures) + options(output)
    assert convert_features.main(argv) == 0
    before = output.read_bytes()
    capsys.readouterr()
    other = arguments("lxmert-tsv", fixtures) + ["--output", str(output), "--feature-dim", "9", "--dtype", "float32"]
    assert convert_features.main(other + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {output} already exists (3 images from "
                                                   f"{fixtures['lxmert-tsv']} (")
    assert ("differs from this command: --dtype float16 in out.h5, float32 in this command; --feature-dim 8 in "
            "out.h5, 9 in this command; pass --overwrite (overwrite=True) to rebuild it") in err
    assert "or write a new store with another --output" in err and "--append" not in err
    assert output.read_bytes() == before and list(tmp_path.iterdir()) == [output]
    float32 = argv + ["--dtype", "float32"]
    assert convert_features.main(float32 + ["--append"]) == 2
    assert "cannot append with other options (--dtype float16 in out.h5, float32" in capsys.readouterr().err
    assert convert_features.main(float32 + ["--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 3, "skipped": 0, "images": 3,
                                                   "unchanged": False}
    with RegionFeatureStore(output) as store:
        assert store.options == {"dtype": "float32", "feature_dim": DIM} and store.stored_dtype == "float32"
        assert torch.equal(store[IDS[0]].features, random_region_features(IDS[0], (2, 6), DIM).features)
    assert list(tmp_path.iterdir()) == [output]
    assert convert_features.main(float32) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 0, "skipped": 3, "images": 3,
                                                   "unchanged": True}
    assert convert_features.main(argv) == 2  # float16 is now the option that differs
    assert "--dtype float32 in out.h5, float16 in this command" in capsys.readouterr().err


def test_progress_in_a_log_is_plain_lines(tmp_path, fixtures, capsys, monkeypatch):
    """Not on a terminal, progress is the suite's plain lines ($ATTN_PROGRESS_SECONDS apart), never carriage returns."""
    monkeypatch.setenv("ATTN_PROGRESS_SECONDS", "0")
    output = tmp_path / "out.h5"
    assert convert_features.main(arguments("mcan-npz", fixtures) + ["--output", str(output), "--feature-dim",
                                                                     str(DIM)]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert [line.split(" | ")[:2] for line in err.splitlines()] == [["out.h5 1/3", "33%"], ["out.h5 2/3", "67%"],
                                                                    ["out.h5 3/3", "100%"]]


# --- streamed and compressed inputs ---

FEEDER = """
import sys, time
data = open(sys.argv[1], "rb").read()
with open(sys.argv[2], "wb", buffering=0) as fifo:  # blocks until the converter opens the FIFO
    for start in range(6):  # a few 1-byte writes first: the reader must not count on whole reads
        fifo.write(data[start:start + 1])
        time.sleep(0.01)
    fifo.write(data[6:])
"""


@contextlib.contextmanager
def feeding(fifo, path):
    """A writer process that writes the bytes of ``path`` into ``fifo`` once a reader opens it."""
    writer = subprocess.Popen([sys.executable, "-c", FEEDER, str(path), str(fifo)], stderr=subprocess.DEVNULL)
    try:
        yield writer
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()


def gzipped(path, target):
    target.write_bytes(gzip.compress(path.read_bytes()))
    return target


def test_a_fifo_fed_by_a_writer_process_is_read_once(tmp_path, fixtures, capsys):
    """A FIFO (here carrying gzip bytes, written a byte at a time at first) converts like the file; the same
    command again reads the new stream through, checking it against the store; another stream is refused."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    output = tmp_path / "out.h5"
    argv = ["bottom-up-tsv", str(fifo)] + options(output)
    packed = gzipped(fixtures["bottom-up-tsv"], tmp_path / "bu.tsv.gz")
    with feeding(fifo, packed) as writer:
        assert convert_features.main(argv) == 0
        assert writer.wait(timeout=30) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 3
    with RegionFeatureStore(output) as store:
        assert store.sources == [{"path": str(fifo), "format": "bottom-up-tsv", "stream": True}]
        for image_id in IDS:
            assert torch.equal(store[image_id].features, random_region_features(image_id, (2, 6), DIM).features)
    with feeding(fifo, fixtures["bottom-up-tsv"]) as writer:  # the same content, uncompressed this time
        assert convert_features.main(argv) == 0
        assert writer.wait(timeout=30) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(output), "written": 0, "skipped": 3, "images": 3,
                                                   "unchanged": True}
    other = bottom_up_tsv.write(tmp_path / "other.tsv", [random_region_features(i, (2, 6), DIM) for i in (20, 21)])
    with feeding(fifo, other):
        assert convert_features.main(argv) == 2
    assert (f"error: {output}: {fifo}, line 1 holds image id 20, but image id {IDS[0]} was stored from there: the "
            f"input changed since it was read") in capsys.readouterr().err


def test_gzip_and_zip_inputs_are_read_without_unpacking(tmp_path, fixtures, capsys):
    tsv = fixtures["bottom-up-tsv"]
    more = bottom_up_tsv.write(tmp_path / "more.tsv", [random_region_features(i, (2, 6), DIM) for i in (20, 21)])
    packed = gzipped(tsv, tmp_path / "bu.tsv.gz")
    with zipfile.ZipFile(tmp_path / "features.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(tsv, "trainval/bottom_up.tsv")
        archive.write(more, "trainval/more.tsv")
    inputs = sorted(tmp_path.iterdir())
    assert convert_features.main(["bottom-up-tsv", str(packed)] + options(tmp_path / "gz.h5")) == 0
    assert sorted(RegionFeatureStore(tmp_path / "gz.h5").image_ids) == sorted(IDS)
    zipped = ["bottom-up-tsv", str(tmp_path / "features.zip")] + options(tmp_path / "zip.h5")
    assert convert_features.main(zipped) == 2
    assert (f"error: {tmp_path / 'features.zip'}: a zip file with 2 files (trainval/bottom_up.tsv, trainval/more.tsv); "
            f"choose the one to read with --member NAME") in capsys.readouterr().err
    assert convert_features.main(zipped + ["--member", "trainval/nope.tsv"]) == 2
    err = capsys.readouterr().err
    assert "no member 'trainval/nope.tsv' in this zip file (it holds trainval/bottom_up.tsv, " in err
    assert convert_features.main(zipped + ["--member", "trainval/more.tsv"]) == 0
    with RegionFeatureStore(tmp_path / "zip.h5") as store:
        assert store.image_ids == [20, 21]
        assert store.sources[0]["member"] == "trainval/more.tsv"
        assert torch.equal(store[21].features, random_region_features(21, (2, 6), DIM).features)
    assert convert_features.main(["bottom-up-tsv", str(tsv), "--member", "x.tsv"] + options(tmp_path / "o.h5")) == 2
    assert "error: --member x.tsv: none of the inputs is a .zip file" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == sorted(inputs + [tmp_path / "gz.h5", tmp_path / "zip.h5"])  # nothing unpacked
    (tmp_path / "cut.tsv.gz").write_bytes(packed.read_bytes()[:-40])
    assert convert_features.main(["bottom-up-tsv", str(tmp_path / "cut.tsv.gz")] + options(tmp_path / "cut.h5")) == 2
    assert re.search(r"cut\.tsv\.gz, line \d: cannot be read \(Compressed file ended before the end-of-stream marker "
                     r"was reached\); the input is truncated or corrupt", capsys.readouterr().err)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for process substitution")
def test_process_substitution_and_stdin_in_a_shell(tmp_path, fixtures):
    packed = gzipped(fixtures["bottom-up-tsv"], tmp_path / "bu.tsv.gz")
    more = bottom_up_tsv.write(tmp_path / "more.tsv", [random_region_features(i, (2, 6), DIM) for i in (20, 21)])
    command = ('cat "$1" | "$2" scripts/convert_features.py bottom-up-tsv <(zcat "$3") - --output "$4" '
               f'--feature-dim {DIM} --quiet')
    run = subprocess.run(["bash", "-c", command, "bash", str(more), sys.executable, str(packed),
                          str(tmp_path / "o.h5")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["written"] == 5
    with RegionFeatureStore(tmp_path / "o.h5") as store:
        assert store.image_ids == IDS + [20, 21]
        substituted, stdin = store.sources
        assert substituted["path"].startswith("/dev/fd/") and substituted["stream"]
        assert stdin == {"path": "<stdin>", "format": "bottom-up-tsv", "stream": True}
        assert torch.equal(store[20].features, random_region_features(20, (2, 6), DIM).features)


def _datasets(path):
    with h5py.File(path, "r") as file:
        return {name: file[name][()] for name in layout.INDEX + (layout.FEATURES, layout.BOXES, layout.SOURCES)}


def test_a_streamed_conversion_killed_midway_resumes_from_the_stream_read_again(tmp_path, capsys):
    """SIGKILL while a FIFO is read; the same command, fed again from the start, skips the committed images
    while reading and ends with the store an uninterrupted conversion writes."""
    tsv = bottom_up_tsv.write(tmp_path / "in.tsv",
                              (random_region_features(i, 36, KILL_DIM) for i in range(KILL_IMAGES)))
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    output = tmp_path / "out.h5"
    partial = layout.partial_path(output)
    argv = ["bottom-up-tsv", str(fifo), "--output", str(output), "--feature-dim", str(KILL_DIM), "--quiet"]
    with feeding(fifo, tsv):
        kill_after_two_batches(argv, partial)
    assert not output.exists() and partial.exists()
    with feeding(fifo, tsv) as writer:
        assert convert_features.main(argv) == 0
        assert writer.wait(timeout=60) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["skipped"] > 0 and counts["written"] + counts["skipped"] == counts["images"] == KILL_IMAGES
    uninterrupted = tmp_path / "uninterrupted.h5"
    with feeding(fifo, tsv):
        assert convert_features.main(["bottom-up-tsv", str(fifo), "--output", str(uninterrupted), "--feature-dim",
                                      str(KILL_DIM), "--quiet"]) == 0
    resumed, whole = _datasets(output), _datasets(uninterrupted)
    assert all(np.array_equal(resumed[name], whole[name]) for name in whole)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.fifo", "in.tsv", "out.h5", "uninterrupted.h5"]
