"""common.utils.inputs.blank_content: why a file holds nothing to read, plain or gzip, with or without a header."""
import gzip

import pytest

from common.utils.inputs import blank_content


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
