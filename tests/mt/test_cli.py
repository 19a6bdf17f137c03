"""The train / evaluate / translate CLIs end to end on a toy corpus, and exact resume."""
import io
import json

import pytest
import torch

from common.utils.paths import CACHE_ENV, DATA_ROOT_ENV
from mt import evaluate, plots, train, translate

TINY = ["model.emb_dim=16", "model.enc_hidden=16", "model.dec_hidden=16", "model.attn_hidden=16",
        "batching.max_tokens=120", "data.num_merges=40", "train.eval_every=3", "train.log_every=1",
        "train.progress=false", "train.keep_checkpoints=3", "train.patience=0", "eval.valid_bleu_sentences=4",
        "eval.beam=2", "eval.batch_sentences=5"]


def run_train(tiny_root, tmp_path, out, steps, extra=()):
    args = ["--preset", "lstm-cpu", "--out", str(out), "--data-root", str(tiny_root),
            f"prepared_dir={tmp_path / 'prep'}", f"train.max_steps={steps}", *TINY, *extra]
    assert train.main(args) == 0


def test_train_resume_evaluate_translate(tiny_root, tmp_path, capsys, monkeypatch):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_train(tiny_root, tmp_path, straight, 6)
    run_train(tiny_root, tmp_path, resumed, 3)
    args = ["--preset", "lstm-cpu", "--out", str(resumed), "--data-root", str(tiny_root),
            f"prepared_dir={tmp_path / 'prep'}", "train.max_steps=6", *TINY, "optim.lr=0.5"]
    assert train.main(args) == 2  # a different learning rate is another run, not a resumption
    assert "optim.lr: 0.002 -> 0.5" in capsys.readouterr().err
    run_train(tiny_root, tmp_path, resumed, 6)  # resumes from update 3
    assert "resuming" in capsys.readouterr().err
    a = torch.load(straight / "checkpoints/step_6.pt", weights_only=False)
    b = torch.load(resumed / "checkpoints/step_6.pt", weights_only=False)
    for name in a["model"]:
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=0, atol=0)

    results = json.loads((straight / "results.json").read_text())
    assert results["updates"] == 6 and set(results["splits"]) == {"val", "test_2016_flickr"}
    test = results["splits"]["test_2016_flickr"]
    assert 0 <= test["bleu"] <= 100 and "case:lc" in test["sacrebleu_signature"]
    assert results["config"]["model"]["arch"] == "lstm" and "packages" in results["environment"]
    assert (straight / "curves.png").stat().st_size > 1000
    metrics = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "val/bleu" in m] == [3, 6]

    assert evaluate.main([str(straight), "--split", "val", "--beam", "1", "--average", "2",
                          "--data-root", str(tiny_root)]) == 0
    printed = capsys.readouterr().out
    assert "SacreBLEU" in printed and printed.splitlines()[-3:] == [
        "files written:", f"  {straight / 'eval_val_avg2_beam1.json'}", f"  {straight / 'eval_val_avg2_beam1.hyp.txt'}"]
    record = json.loads((straight / "eval_val_avg2_beam1.json").read_text())
    assert record["sentences"] == 12 and record["average_last"] == 2
    assert len((straight / "eval_val_avg2_beam1.hyp.txt").read_text().splitlines()) == 12
    assert evaluate.main([str(straight), "--split", "val", "--beam", "1", "--data-root", str(tiny_root),
                          "--checkpoint", str(straight / "checkpoints/step_3.pt")]) == 0
    capsys.readouterr()
    record = json.loads((straight / "eval_val_step_3_beam1.json").read_text())
    assert record["checkpoint"].endswith("step_3.pt")

    monkeypatch.setattr("sys.stdin", io.StringIO("Ein Hund läuft im Park.\n\nDer Mann sitzt.\n"))
    assert translate.main([str(straight), "--beam", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # one output line per input line, the empty one included


def test_cli_errors_are_clear(tmp_path, capsys):
    assert train.main(["--preset", "lstm-cpu", "--out", str(tmp_path / "r"), "--data-root", str(tmp_path),
                       f"prepared_dir={tmp_path / 'p'}"]) == 2
    assert "train.de.gz is missing" in capsys.readouterr().err
    assert train.main(["--preset", "lstm-cpu", "optim.lrr=1"]) == 2
    assert "optim.lrr" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="does not exist; available"):
        train.load_config("nope")
    assert evaluate.main([str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_training_data_that_leaves_no_pair_is_an_error_not_a_run_that_trains_nothing(tiny_root, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--preset", "lstm-cpu", "--out", str(out), "--data-root", str(tiny_root),
            f"prepared_dir={tmp_path / 'prep'}", "train.max_steps=2", *TINY, "data.max_len=2"]
    assert train.main(args) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (  # after the preparation's own lines
        f"error: {tmp_path / 'prep' / 'train.bpe.de'}: all 60 sentence pairs of split 'train' have a side longer "
        f"than data.max_len=2 BPE units; raise data.max_len (null keeps every pair)")
    assert not out.exists()


def test_the_demo_runs_end_to_end_without_data(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    out = tmp_path / "demo"
    titles, save = [], plots.atomic_save_figure

    def save_and_note_title(fig, path):
        titles.append(fig.get_suptitle())
        return save(fig, path)

    monkeypatch.setattr(plots, "atomic_save_figure", save_and_note_title)
    assert train.main(["--preset", "demo", "--out", str(out), "train.max_steps=4", "train.progress=false"]) == 0
    assert titles == ["demo on a toy de-en corpus"]
    assert (tmp_path / "cache/mt/demo/raw/train.de.gz").is_file()  # the toy corpus, written on first use
    assert json.loads((tmp_path / "cache/mt/demo-bpe60/prepared.json").read_text())["splits"] == ["train", "val", "test"]
    results = json.loads((out / "results.json").read_text())
    assert results["updates"] == 4 and set(results["splits"]) == {"val", "test"}
    assert len((out / "test.hyp.txt").read_text().splitlines()) == 100
    printed = capsys.readouterr().out
    assert printed.startswith("demo on a toy de-en corpus: test BLEU ") and f"  {out / 'results.json'}" in printed.splitlines()
