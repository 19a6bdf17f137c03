"""Every train / evaluate / translate / visualize CLI takes --device, and a device this machine lacks is
a one-line error with exit status 2, before anything is read or written."""
import importlib

import pytest

CLIS = ["graphattn.train", "graphattn.evaluate", "mt.train", "mt.evaluate", "mt.translate", "captioning.train",
        "captioning.evaluate", "captioning.visualize", "vqa.train", "vqa.evaluate", "vqa.lxmert.train",
        "vqa.lxmert.evaluate"]
DATA = ["--data-root", "data"]
ARGS = {"graphattn.evaluate": ["runs/none", *DATA], "mt.evaluate": ["runs/none", *DATA], "mt.translate": ["runs/none"],
        "captioning.evaluate": ["runs/none", *DATA], "vqa.evaluate": ["runs/none", *DATA],
        "captioning.visualize": ["runs/none", "--image-id", "1", "--image", "x.jpg", *DATA],
        "vqa.lxmert.evaluate": ["runs/none", *DATA]}


@pytest.mark.parametrize("module", CLIS)
def test_a_missing_gpu_is_a_one_line_error(module, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", open("/dev/null"))
    main = importlib.import_module(module).main
    assert main([*ARGS.get(module, DATA), "--device", "cuda:99"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device cuda:99") and "\n" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the data root
