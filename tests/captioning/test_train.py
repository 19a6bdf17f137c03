import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioning import evaluate, train, training, visualize
from captioning.config import load_config
from captioning.fixtures import DEMO_IMAGE_ID, DEMO_IMAGE_SIZE, write_karpathy_fixture
from captioning.run_inputs import check_run_inputs
from common.features.fixtures import write_format_fixtures
from common.utils import Checkpointer, read_metrics

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("normalizer", ["softmax", "bam-wc"])
def test_tiny_model_overfits_20_fixture_images(coco_fixture, tiny_overrides, tmp_path, normalizer):
    cfg = load_config(normalizer, tiny_overrides(coco_fixture["root"], tmp_path / "run") + [
        "train.epochs=60", "eval.every=0", "eval.split=train", "eval.metrics=[bleu,cider]", "kl.warmup=100"])
    results = training.run(cfg, progress=False)
    assert results["val"]["CIDEr"] > 2.0
    assert results["best_epoch"] == 59 and (tmp_path / "run" / "best.pt").is_file()
    nll = [row["train/nll"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl", "train/nll")]
    assert nll[-1] < 0.2 * nll[0]


def test_resumed_runs_equal_the_uninterrupted_one(coco_fixture, tiny_overrides, tmp_path, ctrl_c_on_call):
    """A run given more epochs, and one stopped by Ctrl-C inside an epoch, each rerun to the end: the same
    history (losses, scheduled sampling, KL, val scores) and the same best weights as a run never stopped."""
    common = ["eval.every=0", "eval.split=val", "eval.metrics=[cider]", "scheduled_sampling.start=0",
              "scheduled_sampling.increase_every=1", "scheduled_sampling.increase_prob=0.2"]

    def config(out, epochs=3, attention="bam-wc"):
        return load_config(attention, tiny_overrides(coco_fixture["root"], tmp_path / out) + common
                           + [f"train.epochs={epochs}"])

    whole = training.run(config("a"), progress=False)
    training.run(config("b", epochs=2), progress=False)
    longer = training.run(config("b"), progress=False)
    assert [r["train/loss"] for r in longer["history"]] == [r["train/loss"] for r in whole["history"]]
    assert [r["ss_prob"] for r in longer["history"]] == pytest.approx([0, 0.2, 0.25])
    assert longer["history"][-1]["train/kl"] > 0
    # 20 images / batches of 5: 4 updates an epoch; update 6 is epoch 2's second
    restore = ctrl_c_on_call(training, "caption_nll", 6)
    with pytest.raises(KeyboardInterrupt):
        training.run(config("c"), progress=False)
    restore()
    assert [p.name for p in Checkpointer(tmp_path / "c").paths()] == ["step_4.pt", "step_6.pt"]
    resumed = training.run(config("c"), progress=False)
    assert resumed["history"] == whole["history"] and resumed["val"] == whole["val"]
    best, reference = (torch.load(tmp_path / run / "best.pt", weights_only=False)["model"] for run in ("c", "a"))
    assert all(torch.equal(best[name], reference[name]) for name in reference)
    assert [p.name for p in Checkpointer(tmp_path / "c").paths()] == ["step_8.pt", "step_12.pt"]  # Ctrl-C's went
    with pytest.raises(ValueError, match="best.pt that captioning.train writes"):
        evaluate.load_checkpoint(tmp_path / "b" / "checkpoints" / "step_12.pt")
    with pytest.raises(ValueError, match="different config"):
        training.run(config("b", epochs=4, attention="softmax"), progress=False)


@pytest.mark.realdata
def test_pipeline_through_the_clis_and_attention_plot(tmp_path, tiny_overrides, attn_data_root, monkeypatch, capsys):
    """Anderson's TSV -> convert_features.py -> prepare -> train -> evaluate -> attention plot.

    The prepared captions go to the (private) cache, not the data root, and train finds them there."""
    monkeypatch.setenv("ATTN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "data"
    paths = write_karpathy_fixture(root, split_lists=attn_data_root / "coco" / "updown", include_demo_image=True)
    ids = [image["cocoid"] for image in json.loads(paths["dataset"].read_text())["images"]]
    tsv = write_format_fixtures(tmp_path / "formats", ids, num_regions=(10, 20), image_size=DEMO_IMAGE_SIZE)
    converted = root / "coco" / "features" / "from_tsv.h5"
    for command in (["scripts/convert_features.py", "bottom-up-tsv", str(tsv["bottom-up-tsv"]), "--output",
                     str(converted), "--quiet"], ["-m", "captioning.prepare", "--data-root", str(root)]):
        subprocess.run([sys.executable, *command], cwd=REPO, check=True, capture_output=True)
    assert not (root / "coco" / "prepared").exists() and list((tmp_path / "cache" / "captioning").iterdir())
    run = tmp_path / "run"
    args = [a for a in tiny_overrides(root, run) if not a.startswith(("data_root", "out_dir", "data.prepared"))]
    assert train.main(["--attention", "bam-wc", "--data-root", str(root), "--out", str(run), "--no-progress",
                       "train.epochs=2", "eval.metrics=[bleu,cider]", f"data.features={converted}", *args]) == 0
    assert evaluate.main([str(run), "--split", "test", "--beam-size", "3", "--metrics", "bleu", "cider",
                          "--no-progress"]) == 0
    captions = json.loads((run / "captions_test.json").read_text())
    test_ids = [int(line.split()[1]) for line in
                (attn_data_root / "coco/updown/karpathy_test_images.txt").read_text().split("\n")[:5]]
    assert sorted(c["image_id"] for c in captions) == sorted(test_ids)
    assert all(isinstance(c["caption"], str) for c in captions)
    results = json.loads((run / "results_test.json").read_text())
    assert results["split"] == "test" and set(results["scores"]) >= {"Bleu_4", "CIDEr"}
    assert results["config"]["attention"]["name"] == "bam-wc" and "packages" in results["environment"]

    figure = tmp_path / "attention.png"
    capsys.readouterr()
    image = attn_data_root / "coco" / "updown" / f"COCO_val2014_{DEMO_IMAGE_ID:012d}.jpg"
    assert visualize.main([str(run), "--image-id", str(DEMO_IMAGE_ID), "--image", str(image),
                           "--out", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
    printed = capsys.readouterr().out.splitlines()  # piped: the caption, then the file written
    assert printed[0].startswith(f'{DEMO_IMAGE_ID}: "') and printed[1:] == ["files written:", f"  {figure}"]


def test_demo_runs_the_pipeline_without_data(tmp_path, monkeypatch, capsys):
    """``python -m captioning.train --demo`` (two epochs here): synthetic COCO written and prepared under the
    run, a model trained, the test split decoded and scored, and every file listed."""
    monkeypatch.chdir(tmp_path)
    assert train.main(["--demo", "--no-progress", "train.epochs=2", "eval.metrics=[bleu,cider]"]) == 0
    run = Path("runs/captioning/demo/softmax")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("softmax: best val (epoch 2 of 2) Bleu_1")
    assert printed[1].startswith("test (5 images, beam 5): Bleu_1") and "CIDEr" in printed[1]
    assert printed[2:] == ["files written:", *(f"  {run}/{name}" for name in (
        "results.json", "best.pt", "checkpoints/", "metrics.jsonl", "config.json", "captions_test.json",
        "results_test.json", "data/"))]
    assert json.loads((run / "results.json").read_text())["config"]["data_root"] == str(run / "data")
    test = json.loads((run / "results_test.json").read_text())
    assert test["images"] == 5 and set(test["scores"]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}
    assert len(json.loads((run / "captions_test.json").read_text())) == 5
    assert (run / "data" / "coco" / "prepared" / "vocab.json").is_file()
    # the demo writes its own data, never into a data root
    assert train.main(["--demo", "--data-root", str(tmp_path), "--out", "elsewhere", "--no-progress"]) == 2
    assert "drop --data-root" in capsys.readouterr().err and not Path("elsewhere").exists()


def test_box_heatmap_sums_weights_of_covering_boxes():
    heat = visualize.box_heatmap([(0, 0, 2, 2), (1, 1, 3, 3)], [0.25, 0.75], height=3, width=4)
    expected = torch.tensor([[0.25, 0.25, 0, 0], [0.25, 1.0, 0.75, 0], [0, 0.75, 0.75, 0]], dtype=torch.float64)
    assert torch.equal(torch.from_numpy(heat), expected)


def test_config_typos_are_errors(capsys, tmp_path):
    with pytest.raises(ValueError, match="att2in.yaml"):
        load_config("softmax", ["optim.learning_rate=1"])
    assert train.main(["--data-root", str(tmp_path), "--no-progress", "data.prepared=coco/prepared"]) == 2
    assert "captioning.prepare" in capsys.readouterr().err
    assert train.main(["--data-root", str(tmp_path / "typo"), "--no-progress"]) == 2
    assert "no such directory (nothing was created)" in capsys.readouterr().err and not (tmp_path / "typo").exists()


def test_without_data_the_missing_files_are_named_not_the_file_prepare_would_write(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTN_CACHE_DIR", str(tmp_path / "cache"))
    assert train.main(["--data-root", str(tmp_path), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path}/coco/dataset_coco.json (read by captioning.prepare) does not exist: download "
                   f"Karpathy's caption_datasets.zip (https://cs.stanford.edu/people/karpathy/deepimagesent/) and put "
                   f"dataset_coco.json there, then run `python -m captioning.prepare --data-root {tmp_path}`; "
                   f"{tmp_path}/coco/features/trainval_36.h5 (data.features) does not exist: create it with "
                   f"scripts/convert_features.py or scripts/extract_features.py\n")
    assert not (tmp_path / "run").exists()
    # the advice works: with those files in place and prepared as told, nothing is missing
    write_karpathy_fixture(tmp_path)
    from captioning import prepare
    assert prepare.main(["--data-root", str(tmp_path)]) == 0
    check_run_inputs(load_config("softmax", [f"data_root={tmp_path}"]))


def test_plot_without_prior_has_one_panel_per_word(tmp_path):
    import matplotlib.image as mpimg

    image = torch.rand(60, 80, 3).numpy()
    boxes = torch.tensor([[0, 0, 40, 30], [30, 20, 79, 59]], dtype=torch.float32).numpy()
    posterior = torch.tensor([[1.0, 0], [0, 1], [0.5, 0.5]]).numpy()
    words = ["a", "dog", "<eos>"]
    one_row = mpimg.imread(visualize.plot_attention(image, boxes, words, posterior, None, tmp_path / "a.png", columns=3))
    two_rows = mpimg.imread(visualize.plot_attention(image, boxes, words, posterior, posterior[2], tmp_path / "b.png",
                                                     columns=3))  # the prior panel starts a second row
    assert one_row.shape[1] == two_rows.shape[1] and two_rows.shape[0] > 1.5 * one_row.shape[0]
    with pytest.raises(ValueError, match="posterior must be"):
        visualize.plot_attention(image, boxes, ["a"], torch.ones(2, 2).numpy(), None, tmp_path / "bad.png")
