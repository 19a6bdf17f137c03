"""vqa.train / vqa.evaluate end to end on the fixture: files, resumption, noise and Monte Carlo
paths, MCAN's learning-rate schedule, clear errors."""
import json
import re

import pytest
import torch

from common.metrics import expected_calibration_error
from common.text import Vocabulary
from common.utils.distributed import DistEnv
from vqa import evaluate as vqa_evaluate
from vqa import train as vqa_train
from vqa.evaluation import load_submission
from vqa.fixtures import write_vqa_fixture
from vqa.mcan.optim import lr_factor
from vqa.predict import add_feature_noise
from vqa.run_inputs import word_vectors

from .helpers import TINY

SMALL = [f"model.{k}={v}" for k, v in TINY.items()] + ["train.batch_size=10", "train.eval_batch_size=25",
                                                      "train.log_every=2"]


def test_mcan_learning_rate_schedule():
    factors = [lr_factor(u, 10, 3, [10, 12], 0.2) for u in range(1, 131)]
    assert factors[0] == factors[9] == 0.25           # epoch 1: 1/4
    assert factors[10] == factors[19] == 0.5          # epoch 2: 2/4
    assert factors[20] == factors[29] == 0.75         # epoch 3: 3/4
    assert factors[30] == factors[99] == 1.0          # epochs 4-10
    assert factors[100] == pytest.approx(0.2) and factors[119] == pytest.approx(0.2)   # from epoch 11 (index 10)
    assert factors[120] == pytest.approx(0.04)        # epoch 13 (index 12)


def test_feature_noise_leaves_padding_zero():
    features = torch.ones(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    features[~mask] = 0
    noisy = add_feature_noise(features, mask, 2.0, torch.Generator().manual_seed(0))
    assert (noisy[~mask] == 0).all() and not torch.equal(noisy[mask], features[mask])
    big = add_feature_noise(torch.zeros(1, 20000, 1), torch.ones(1, 20000, dtype=torch.bool), 2.0)
    assert big.std().item() == pytest.approx(2.0, rel=0.05)
    assert add_feature_noise(features, mask, 0.0) is features


def test_confidence_view_gives_the_calibration_of_confidences():
    confidence = torch.tensor([0.9, 0.9, 0.2, 0.2], dtype=torch.double)
    correct = torch.tensor([True, False, False, False])
    probs, targets = vqa_evaluate.confidence_view(confidence, correct)
    # bins: {0.9: acc 0.5}, {0.2: acc 0} -> ECE = 0.5 * 0.4 + 0.5 * 0.2
    assert expected_calibration_error(probs, targets, num_bins=10) == pytest.approx(0.3)


def test_train_resume_and_evaluate(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--data-root", str(vqa_fixture.root), "--out", str(out), "--attention", "bam-wc", "--no-progress",
              "kl.weight=0.01", *SMALL]
    assert vqa_train.main([*common, "--epochs", "1"]) == 0
    first = json.loads((out / "results.json").read_text())
    assert len(first["epochs"]) == 1 and first["config"]["attention"]["name"] == "bam-wc"
    assert first["environment"]["packages"]["torch"] and first["questions_per_second_train"] > 0
    assert set(first["final_eval"]["per_answer_type"]) == {"yes/no", "number", "other"}
    assert vqa_train.main([*common, "--epochs", "2"]) == 0        # resumes after epoch 1
    second = json.loads((out / "results.json").read_text())
    assert [e["epoch"] for e in second["epochs"]] == [0, 1]
    assert second["epochs"][0] == first["epochs"][0]
    # 50 questions in batches of 10: 5 updates an epoch, a checkpoint at the end of each
    assert {p.name for p in (out / "checkpoints").iterdir()} == {"step_5.pt", "step_10.pt"}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("train/kl" in r and r["train/kl"] > 0 for r in lines) and any("val/accuracy" in r for r in lines)
    assert len(load_submission(out / "val_predictions.json")) == 50

    report_path = tmp_path / "eval.json"
    capsys.readouterr()
    assert vqa_evaluate.main([str(out), "--noise-std", "3.0", "--mc-samples", "3", "--no-progress",
                              "--out", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    printed = capsys.readouterr().out.splitlines()  # piped: a line per condition, then every file written
    assert [line.split(":")[0] for line in printed[:2]] == ["val clean", "val noise_3"]
    assert "MC accuracy" in printed[1] and "->" not in printed[1]
    assert re.match(r"val clean: accuracy [\d.]+ \(yes/no [\d.]+, number [\d.]+, other [\d.]+\)", printed[0])
    assert printed[2:] == ["files written:", f"  {report_path}"] + [
        f"  {tmp_path / name}" for name in ("val_clean_results.json", "reliability_val_clean.png",
                                            "val_noise_3_results.json", "reliability_val_noise_3.png")]
    assert report["conditions"]["clean"]["accuracy"]["overall"] == second["final_eval"]["overall"]

    (tmp_path / "empty").mkdir()  # the run's split without its data: every missing file in one line
    assert vqa_evaluate.main([str(out), "--data-root", str(tmp_path / "empty"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(f"(data.splits.val.{field})" in err
                                        for field in ("questions", "annotations", "features"))
    noisy = report["conditions"]["noise_3"]
    assert noisy["noise_std"] == 3.0 and load_submission(noisy["results_file"]) != load_submission(
        report["conditions"]["clean"]["results_file"])
    for condition in report["conditions"].values():
        mc = condition["mc"]
        assert 0 <= mc["pavpu"] <= 100 and 0 <= mc["ece"] <= 100 and mc["samples"] == 3
        assert (tmp_path / f"reliability_val_{'clean' if condition['noise_std'] == 0 else 'noise_3'}.png").stat().st_size

    # a test split has no annotations: predictions in the official format only
    test_root = write_vqa_fixture(tmp_path / "test_data", subtypes=("test2015",), num_images=2, feature_dim=16).root
    assert vqa_evaluate.main([str(out), "--split", "test", "--data-root", str(test_root), "--no-progress",
                              "--out", str(tmp_path / "test" / "eval.json")]) == 0
    clean = json.loads((tmp_path / "test" / "eval.json").read_text())["conditions"]["clean"]
    assert "accuracy" not in clean and len(load_submission(clean["results_file"])) == 10


def test_resuming_with_another_config_is_refused(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    (out).mkdir()
    (out / "config.json").write_text(json.dumps({"seed": 123}))
    code = vqa_train.main(["--data-root", str(vqa_fixture.root), "--out", str(out), "--epochs", "1", *SMALL])
    assert code == 2 and "holds a run with a different config" in capsys.readouterr().err


def test_without_data_one_line_names_every_missing_input_and_leaves_no_run_folder(tmp_path, capsys):
    glove = tmp_path / "glove.txt"
    code = vqa_train.main(["--data-root", str(tmp_path), "--out", str(tmp_path / "run"), "--epochs", "1",
                           f"data.glove={glove}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    for key in ("data.answers", "data.glove", *(f"data.splits.{split}.{field}" for split in ("train", "val")
                                                for field in ("questions", "annotations", "features"))):
        assert f" ({key})" in err
    assert f"{tmp_path}/vqa/v2_OpenEnded_mscoco_train2014_questions.json (data.splits.train.questions)" in err
    assert f"{glove} (data.glove) does not exist: download glove.840B.300d.txt" in err
    assert "https://visualqa.org/download.html" in err and "scripts/convert_features.py" in err
    assert not (tmp_path / "run").exists()
    assert vqa_train.main(["--data-root", str(tmp_path), "model.hiden=3"]) == 2
    assert "model.hiden" in capsys.readouterr().err


def test_a_batch_larger_than_the_data_is_an_error_not_a_run_that_trains_nothing(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--data-root", str(vqa_fixture.root), "--out", str(out), "--epochs", "1", "--no-progress", *SMALL]
    assert vqa_train.main([*args, "train.batch_size=64"]) == 2  # 50 training questions, last partial batch dropped
    assert capsys.readouterr().err == (
        "error: an epoch would make no update: train.batch_size=64 exceeds the 50 training questions of "
        "data.train_splits ['train'] and the last partial batch is dropped; set train.batch_size=50 or less\n")
    assert not out.exists()
    assert vqa_train.main([*args, "train.batch_size=50"]) == 0
    assert json.loads((out / "results.json").read_text())["epochs"][0]["train_bce_per_question"] > 0


def test_a_failed_start_writes_no_run_files_that_would_block_the_fixed_rerun(vqa_fixture, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--data-root", str(vqa_fixture.root), "--out", str(out), "--epochs", "1", "--no-progress", *SMALL]
    assert vqa_train.main([*args, f"data.glove={tmp_path / 'glove.txt'}"]) == 2
    assert "glove.txt (data.glove) does not exist" in capsys.readouterr().err and not out.exists()
    assert vqa_train.main(args) == 0  # another data.glove: not refused as a different run


def test_glove_vectors_reach_the_run(vqa_fixture, tmp_path, capsys):
    glove = tmp_path / "glove.txt"
    glove.write_text("is " + " ".join(["0.5"] * 16) + "\nthe " + " ".join(["-1"] * 16) + "\n")
    cfg = vqa_train.load_config([*SMALL, f"data.glove={glove}", f"data_root={vqa_fixture.root}"])
    vocab = Vocabulary(["is", "the", "zebra"], specials=("<pad>", "<unk>"))
    vectors = word_vectors(cfg, vocab, DistEnv())
    assert torch.equal(vectors[vocab.index("is")], torch.full((16,), 0.5)) and not vectors[vocab.index("zebra")].any()
    assert "GloVe: vectors for 66.7% of 5 question words" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model.word_dim=300; set model.word_dim=16"):
        word_vectors(vqa_train.load_config([f"data.glove={glove}"]), vocab, DistEnv())


def test_demo_writes_its_data_trains_and_evaluates_without_downloads(tmp_path, capsys):
    out = tmp_path / "demo"
    assert vqa_train.main(["--demo", "--out", str(out), "--no-progress", "train.epochs=1"]) == 0
    captured = capsys.readouterr()
    assert f"demo: MCAN softmax on synthetic questions with random region features (written to {out / 'data'})" \
        in captured.err
    assert f"  {out / 'results.json'}" in captured.out.splitlines()
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["data_root"] == str(out / "data") and results["config"]["model"]["hidden"] == 64
    assert len(results["epochs"]) == 1 and results["final_eval"]["overall"] > 0
    assert len(load_submission(out / "val_predictions.json")) == 200
    assert vqa_train.main(["--demo", "--data-root", str(tmp_path), "--out", str(tmp_path / "other")]) == 2
    assert "--demo writes its synthetic data to <out>/data" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
