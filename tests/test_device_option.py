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


#: The train CLIs that write a demo's data before training (vqa.train and vqa.lxmert.train also announce it).
DEMOS = {"vqa.train": ["--demo"], "vqa.lxmert.train": ["--demo"], "captioning.train": ["--demo"],
         "tagging.train": ["--demo"], "mt.train": ["--preset", "demo"]}


@pytest.mark.parametrize("module", sorted(DEMOS))
def test_a_missing_gpu_is_said_before_a_demo_writes_or_announces_anything(module, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTN_CACHE_DIR", str(tmp_path / "cache"))  # where mt's demo corpus would go
    main = importlib.import_module(module).main
    assert main([*DEMOS[module], "--device", "cuda:99", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda:99") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
