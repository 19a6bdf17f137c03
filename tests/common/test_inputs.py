"""common.utils.inputs: why a file holds nothing to read (plain or gzip, with or without a header), and a JSON file read
with errors that name the file and the fix."""
import gzip

import pytest

from common.utils.inputs import blank_content, read_json


@pytest.mark.parametrize("data, header, reason", [
    (b"", False, "the file is empty"), (b"", True, "the file is empty"),
    (b"\n \r\n\t\n", False, "the file holds only blank lines"),
    (b"a\tb\n", True, "the file holds only its header line"), (b"\na\tb\n\n", True, "the file holds only its header line"),
    (b"a\tb\n", False, None), (b"a\tb\n\n1\t2\n", True, None)])
@pytest.mark.parametrize("gz", [False, True])
def test_blank_content(tmp_path, data, header, reason, gz):
    path = tmp_path / ("f.tsv.gz" if gz else "f.tsv")
    path.write_bytes(gzip.compress(data) if gz else data)
    assert blank_content(path, header) == reason


class BadInput(ValueError):
    pass


def test_read_json_names_the_file_and_the_fix_of_each_failure(tmp_path):
    path = tmp_path / "answers.json"
    fix = "use MCAN's answer_dict.json"
    with pytest.raises(FileNotFoundError, match=f"^answer vocabulary file {path} does not exist; {fix}$"):
        read_json(path, "answer vocabulary", "answers", fix, BadInput, missing=FileNotFoundError)
    with pytest.raises(BadInput, match=f"^answer vocabulary file {path} does not exist"):
        read_json(path, "answer vocabulary", "answers", fix, BadInput)
    path.write_text(" \n")
    with pytest.raises(BadInput, match=f"^{path}: no answers: the file holds only blank lines; {fix}$"):
        read_json(path, "answer vocabulary", "answers", fix, BadInput)
    path.write_text('{"yes": 0,')
    with pytest.raises(BadInput, match=rf"^{path} is not valid JSON \(.*line 1 column 11.*\); {fix}$"):
        read_json(path, "answer vocabulary", "answers", fix, BadInput)
    path.write_text('{"yes": 0}')
    assert read_json(path, "answer vocabulary", "answers", fix) == {"yes": 0}
