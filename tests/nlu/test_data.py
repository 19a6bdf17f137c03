"""GLUE readers: the real files (row and label counts of the data README, section 7) and one-line errors."""
from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from nlu.data import GlueFormatError, _lines, read_split, split_path
from nlu.tasks import TASKS, get_task

# (task, split) -> (rows, label counts by label string or None), from the README table.
EXPECTED = {
    ("CoLA", "train"): (8551, {"0": 2528, "1": 6023}), ("CoLA", "dev"): (1043, {"0": 322, "1": 721}),
    ("CoLA", "test"): (1063, None),
    ("MRPC", "train"): (3668, {"0": 1194, "1": 2474}), ("MRPC", "dev"): (408, {"0": 129, "1": 279}),
    ("MRPC", "test"): (1725, None),
    ("RTE", "train"): (2490, {"entailment": 1249, "not_entailment": 1241}),
    ("RTE", "dev"): (277, {"entailment": 146, "not_entailment": 131}), ("RTE", "test"): (3000, None),
    ("STS-B", "train"): (5749, None), ("STS-B", "dev"): (1500, None), ("STS-B", "test"): (1379, None),
    ("SST-2", "train"): (67349, {"0": 29780, "1": 37569}), ("SST-2", "dev"): (872, {"0": 428, "1": 444}),
    ("SST-2", "test"): (1821, None),
    ("WNLI", "train"): (635, {"0": 323, "1": 312}), ("WNLI", "dev"): (71, {"0": 40, "1": 31}),
    ("WNLI", "test"): (146, None),
}


@pytest.mark.realdata
@pytest.mark.parametrize("task,split", sorted(EXPECTED))
def test_real_split_counts(attn_data_root, task, split):
    data = read_split(task, split, attn_data_root)
    rows, label_counts = EXPECTED[task, split]
    spec = get_task(task)
    assert data.path == attn_data_root / "glue" / spec.directory / f"{split}.tsv.gz"
    assert len(data.text_a) == len(data.line_numbers) == rows
    assert (data.text_b is None) == (not spec.pair)
    if data.text_b is not None:
        assert len(data.text_b) == rows
    if split == "test":
        assert data.labels is None
    elif spec.regression:
        assert len(data.labels) == rows and all(isinstance(s, float) and 0.0 <= s <= 5.0 for s in data.labels)
        assert min(data.labels) == 0.0 and max(data.labels) == 5.0
    else:
        assert dict(Counter(spec.labels[i] for i in data.labels)) == label_counts
    header = spec.layout(split).header
    assert data.line_numbers[0] == (2 if header else 1) and data.line_numbers[-1] == rows + header


@pytest.mark.realdata
@pytest.mark.parametrize("task", sorted(TASKS))
def test_real_dev_matches_plain_tab_split(attn_data_root, task):
    """Independent check: each row equals the plain tab split of its line (no quote handling anywhere)."""
    spec, data = get_task(task), read_split(task, "dev", attn_data_root)
    with gzip.open(data.path, "rt", encoding="utf-8-sig") as handle:
        lines = handle.read().split("\n")
    layout = spec.layout("dev")
    for i, number in enumerate(data.line_numbers):
        fields = lines[number - 1].split("\t")
        assert data.text_a[i] == fields[layout.text_a]
        if layout.text_b is not None:
            assert data.text_b[i] == fields[layout.text_b]


@pytest.mark.realdata
def test_real_quirks(attn_data_root):
    mrpc = read_split("mrpc", "train", attn_data_root)  # header "\ufeffQuality ..." skipped, not read as a row
    assert mrpc.text_a[0] == ("Amrozi accused his brother , whom he called \" the witness \" , of deliberately "
                              "distorting his evidence .")
    assert not any("\ufeff" in t for t in mrpc.text_a)
    cola = read_split("CoLA", "dev", attn_data_root)  # no header, no final newline
    assert cola.text_a[0] == "The sailors rode the breeze clear of the rocks."
    assert cola.text_a[-1] == "John talked to Bill about himself."
    assert sum('"' in t for t in read_split("rte", "train", attn_data_root).text_a) > 10
    stsb = read_split("sts-b", "test", attn_data_root)  # default CSV quoting would merge rows (1,120)
    assert len(stsb) == 1379 and any('"' in t for t in stsb.text_a + stsb.text_b)
    assert read_split("stsb", "train", attn_data_root).labels[0] == 5.0


# ---- hand-made files ----------------------------------------------------------------------------------------

RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"


def write(path: Path, text, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8") if isinstance(text, str) else text
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def error_of(task, split, root) -> str:
    with pytest.raises(GlueFormatError) as info:
        read_split(task, split, root)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("gz", [False, True])
def test_handmade_rte_and_locations(tmp_path, gz):
    text = RTE_HEADER + '0\tHe said "yes".\tHe agreed.\tentailment\n1\tA\tB\tnot_entailment'
    write(tmp_path / "glue" / "RTE" / "dev.tsv", text, gz)
    data = read_split("RTE", "dev", tmp_path)
    assert data.text_a == ['He said "yes".', "A"] and data.text_b == ["He agreed.", "B"]
    assert data.labels == [0, 1] and data.line_numbers == [2, 3] and data.task == "RTE"
    # the same file found in a glue_data/<TASK> tree and in a directory of TSVs
    assert read_split("rte", "dev", tmp_path / "glue").labels == [0, 1]
    assert read_split("rte", "dev", tmp_path / "glue" / "RTE").labels == [0, 1]


def test_gz_preferred_and_env_default(tmp_path, monkeypatch):
    write(tmp_path / "glue" / "WNLI" / "dev.tsv", RTE_HEADER + "0\ta\tb\t1\n")
    write(tmp_path / "glue" / "WNLI" / "dev.tsv", RTE_HEADER + "0\ta\tb\t0\n", gz=True)
    monkeypatch.setenv("ATTN_DATA_ROOT", str(tmp_path))
    assert split_path("wnli", "dev").name == "dev.tsv.gz" and read_split("wnli", "dev").labels == [0]
    monkeypatch.delenv("ATTN_DATA_ROOT")
    with pytest.raises(GlueFormatError, match="ATTN_DATA_ROOT"):
        read_split("wnli", "dev")


def test_bom_stripped_on_first_line_only(tmp_path):
    write(tmp_path / "dev.tsv", "\ufeffsrc\t1\t\tFirst.\nsrc\t0\t*\t\ufeffSecond.")
    data = read_split("cola", "dev", tmp_path)
    assert data.text_a == ["First.", "\ufeffSecond."] and data.labels == [1, 0]
    assert list(_lines(tmp_path / "dev.tsv")) == ["src\t1\t\tFirst.\n", "src\t0\t*\t\ufeffSecond."]


def test_missing_file(tmp_path):
    message = error_of("MRPC", "train", tmp_path)
    assert str(tmp_path / "glue" / "MRPC" / "train.tsv.gz") in message and "download_glue_data.py" in message


@pytest.mark.parametrize("gz", [False, True])
def test_wrong_column_count(tmp_path, gz):
    path = write(tmp_path / "RTE" / "train.tsv", RTE_HEADER + "0\ta\tb\tentailment\n1\ta\t\"b\tc\"\tentailment\n", gz)
    message = error_of("RTE", "train", tmp_path)
    assert f"{path}:3:" in message and "row" in message and "expected 4" in message and "got 5" in message
    assert "quoting off" in message


def test_blank_line_and_wrong_header(tmp_path):
    path = write(tmp_path / "dev.tsv", RTE_HEADER + "0\ta\tb\tentailment\n\n")
    message = error_of("RTE", "dev", tmp_path)
    assert f"{path}:3:" in message and "blank line" in message
    path = write(tmp_path / "dev.tsv", "index\tsentence\n")  # a CoLA test header where RTE dev is expected
    assert f"{path}:1:" in error_of("RTE", "dev", tmp_path)


@pytest.mark.parametrize("task, text, reason", [
    ("RTE", "", "the file is empty"), ("RTE", RTE_HEADER, "the file holds only its header line"),
    ("RTE", RTE_HEADER + "\n\n", "the file holds only its header line"),
    ("RTE", "\n \n\n", "the file holds only blank lines"),
    ("CoLA", "", "the file is empty"), ("CoLA", "\n\n", "the file holds only blank lines")])
@pytest.mark.parametrize("gz", [False, True])
def test_a_file_without_examples_names_the_file_and_the_fix(tmp_path, task, text, reason, gz):
    path = write(tmp_path / "train.tsv", text, gz)
    assert error_of(task, "train", tmp_path) == (f"{path}: no {task} train examples: {reason}; get the official files "
                                                 f"with download_glue_data.py (glue_data/<TASK>/) or see section 7 of "
                                                 f"the shared data README")


def test_label_outside_task_labels(tmp_path):
    path = write(tmp_path / "dev.tsv", RTE_HEADER + "0\ta\tb\tentailment\n1\ta\tb\tneutral\n")
    message = error_of("RTE", "dev", tmp_path)
    assert f"{path}:3:" in message and "label (column 4)" in message and "'neutral'" in message
    assert "not_entailment" in message


@pytest.mark.parametrize("score", ["5.5", "-0.1", "high", "nan", ""])
def test_bad_stsb_score(tmp_path, score):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tg\tf\t2012\t0001\tnone\tnone\tA plane.\tA jet.\t"
    path = write(tmp_path / "glue" / "STS-B" / "train.tsv", header + row + "3.2\n" + row + score + "\n")
    message = error_of("STS-B", "train", tmp_path)
    assert f"{path}:3:" in message and "label (column 10)" in message and "[0, 5]" in message


def test_stsb_scores_are_floats(tmp_path):
    row = "0\tg\tf\t2012\t0001\tnone\tnone\tA plane.\tA jet.\t"
    write(tmp_path / "dev.tsv", "\t".join("abcdefghij") + "\n" + row + "0\n" + row + "4.750\n")
    assert read_split("stsb", "dev", tmp_path).labels == [0.0, 4.75]


@pytest.mark.parametrize("column,field", [(1, "text_a (column 2)"), (2, "text_b (column 3)")])
def test_empty_text(tmp_path, column, field):
    fields = ["7", "a", "b", "1"]
    fields[column] = "  "
    path = write(tmp_path / "train.tsv", RTE_HEADER + "\t".join(fields) + "\n")
    message = error_of("WNLI", "train", tmp_path)
    assert f"{path}:2:" in message and field in message and "empty" in message


def test_not_gzip_and_truncated_gzip(tmp_path):
    path = write(tmp_path / "train.tsv.gz", RTE_HEADER)
    message = error_of("RTE", "train", tmp_path)
    assert f"{path}:1:" in message and "gzip" in message
    body = gzip.compress((RTE_HEADER + "0\ta\tb\tentailment\n" * 2000).encode())
    path.write_bytes(body[: len(body) // 2])
    message = error_of("RTE", "train", tmp_path)
    assert str(path) in message and "gzip" in message


@pytest.mark.parametrize("gz", [False, True])
def test_non_utf8(tmp_path, gz):
    text = RTE_HEADER.encode() + b"0\ta\tb\tentailment\n1\tcaf\xe9\tb\tentailment\n"
    path = write(tmp_path / "dev.tsv", text, gz)
    message = error_of("RTE", "dev", tmp_path)
    assert f"{path}:3:" in message and "\\xe9" in message and "column 6" in message and "UTF-8" in message


def test_task_names():
    assert {get_task(n).name for n in ("sts-b", "stsb", "STS-B", "sts_b")} == {"STS-B"}
    assert get_task("sst2").directory == "SST-2" and get_task("COLA").main_metric == "mcc"
    assert get_task("rte").labels == ("entailment", "not_entailment") and get_task("stsb").num_labels == 1


def test_unknown_task_and_split(tmp_path):
    with pytest.raises(ValueError, match="CoLA, MRPC, RTE, STS-B, SST-2, WNLI"):
        read_split("qqp", "dev", tmp_path)
    with pytest.raises(ValueError, match="train, dev, test"):
        read_split("rte", "validation", tmp_path)
