"""Training: a tiny adapted LXMERT overfits fixture questions; the CLIs train, resume and evaluate."""
from __future__ import annotations

import json
import re

import pytest
import torch

from common.attention import aux_losses, clamp_spans
from common.features import RegionFeatureStore
from common.utils import Checkpointer, read_metrics
from vqa.answers import AnswerVocab
from vqa.data import VQADataset, load_annotations, load_questions
from vqa.evaluation import question_accuracy, vqa_accuracy
from vqa.lxmert import Adaptation, build_vqa_model, vqa_loss
from vqa.lxmert import evaluate as lxmert_evaluate
from vqa.lxmert import prepare as lxmert_prepare
from vqa.lxmert import train as lxmert_train
from vqa.lxmert import training as lxmert_training
from vqa.lxmert.data import bert_encoder, model_inputs

from .helpers import tiny_config


def test_tiny_span_model_overfits_fixture_questions(vqa_root):
    root, fixture, vocab_size = vqa_root
    answers = AnswerVocab.load(fixture.answers)
    annotations = load_annotations(fixture.annotations["train2014"])
    data = VQADataset(load_questions(fixture.questions["train2014"]), annotations,
                      RegionFeatureStore(fixture.features["train2014"]), answers, bert_encoder(root / "vocab.txt", 20))
    batch = data.collate([data[i] for i in range(len(data))])
    inputs = model_inputs(batch, torch.device("cpu"))
    torch.manual_seed(0)
    config = tiny_config(vocab_size=vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = build_vqa_model(config, len(answers), Adaptation.from_dict({"span": {}}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

    def accuracy():
        model.eval()
        with torch.no_grad():
            best = model(**inputs).question_answering_score.argmax(-1).tolist()
        model.train()
        return vqa_accuracy(annotations, {q: answers.answer(i) for q, i in zip(batch["question_id"].tolist(), best)})

    before = accuracy().overall
    losses = []
    for _ in range(250):
        with aux_losses() as aux:
            logits = model(**inputs).question_answering_score
        loss = vqa_loss(logits, batch["target"]) + aux.total()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        clamp_spans(model)
        losses.append(loss.item())
    ceiling = 100 * sum(max(question_accuracy(a, [h["answer"] for h in x["answers"]]) for a in answers.answers)
                        for x in annotations) / len(annotations)
    assert before < 30 and ceiling > 90
    assert accuracy().overall > 75 and losses[-1] < 0.2 * losses[0]


def _train_args(root, out, *extra):
    random_init = ("model.random_init={vocab_size: 48, hidden_size: 32, num_attention_heads: 2, "
                   "intermediate_size: 64, l_layers: 4, x_layers: 2, r_layers: 2, visual_feat_dim: 16}")
    return ["--data-root", str(root), "--out", str(out), "--no-progress", "data.answers=vqa/mcan/answer_dict.json",
            "data.vocab=vocab.txt", random_init, "train.batch_size=8", "train.log_every=1", "--threads", "1", *extra]


def _weights(out):
    return torch.load(Checkpointer(out).paths()[-1], weights_only=False)["model"]


def _curve(out):
    """The logged training losses of each update (the timings left out)."""
    return [{k: v for k, v in r.items() if k != "train_seconds"} for r in read_metrics(out / "metrics.jsonl")
            if "train/loss" in r]


def test_train_cli_resumes_exactly_and_evaluate_reproduces_its_accuracy(vqa_root, tmp_path, capsys):
    root, _, _ = vqa_root
    variant = ["--variant", "layerdrop", "model.adaptation.layerdrop={language: 2, vision: 1, cross: 1}",
               "model.adaptation.span={language: {max_span: 20}}"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert lxmert_train.main(_train_args(root, straight, *variant, "train.epochs=2")) == 0
    printed = capsys.readouterr()  # not a terminal: lines, no bars
    assert "epoch 1/2 (update 4): train BCE" in printed.err and "epoch 2/2 (update 8)" in printed.err
    summary = printed.out.splitlines()
    assert summary[0].startswith("LXMERT layerdrop: 8 updates, ")
    assert re.search(r", val accuracy [\d.]+ \(yes/no [\d.]+, number [\d.]+, other [\d.]+\)$", summary[0])
    assert summary[1] == "files written:" and summary[2] == f"  {straight / 'results.json'}"
    assert f"  {straight / 'val_predictions.json'}" in summary
    assert lxmert_train.main(_train_args(root, resumed, *variant, "train.epochs=2", "train.max_steps=3")) == 0
    first_seconds = json.loads((resumed / "results.json").read_text())["train_seconds"]
    with open(resumed / "metrics.jsonl", "a") as f:                     # logged after the checkpoint, then killed
        f.write(json.dumps({"step": 4, "train/loss": 99.0}) + "\n")
    assert lxmert_train.main(_train_args(root, resumed, *variant, "train.epochs=2")) == 0
    assert json.loads((resumed / "results.json").read_text())["train_seconds"] > first_seconds > 0
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the training curve of the resumed run is the straight run's: no update logged twice or lost
    curves = [_curve(out) for out in (straight, resumed)]
    assert [r["step"] for r in curves[1]] == list(range(1, 9)) and curves[0] == curves[1]

    results = json.loads((straight / "results.json").read_text())
    assert results["steps"] == 8 and [e["step"] for e in results["epochs"]] == [4, 8]
    flops = results["flops_per_question"]
    assert flops["pruned"] < flops["full"]
    assert results["environment"]["packages"]["transformers"]
    assert (straight / "spans.png").stat().st_size > 0 and not (straight / "alphas.png").exists()
    logged = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["step"] == 0 and logged[0]["span/language.0/h0"] == 20.0    # z starts at 1
    assert any("train/span_penalty" in r for r in logged)

    capsys.readouterr()
    assert lxmert_evaluate.main([str(straight), "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert re.match(r"val: 32 questions, accuracy [\d.]+ \(yes/no [\d.]+, number [\d.]+, other [\d.]+\)$", printed[0])
    assert printed[-3:] == [
        "files written:", f"  {straight / 'eval_val.json'}", f"  {straight / 'val_predictions.json'}"]
    evaluated = json.loads((straight / "eval_val.json").read_text())
    assert evaluated["accuracy"]["overall"] == results["final_eval"]["overall"]
    assert evaluated["pruned"] and evaluated["flops_per_question"] == flops
    submission = json.loads((straight / "val_predictions.json").read_text())
    assert len(submission) == 32 and set(submission[0]) == {"question_id", "answer"}

    # the unannotated test split: predictions only, every layer when asked
    assert lxmert_evaluate.main(["--run", str(straight), "--split", "test", "--no-progress", "--no-prune"]) == 0
    assert "--run DIR is deprecated" in capsys.readouterr().err  # the old spelling still works
    evaluated = json.loads((straight / "eval_test.json").read_text())
    assert evaluated["accuracy"] is None and not evaluated["pruned"]
    assert evaluated["flops_per_question"]["full"] == flops["full"]
    assert len(json.loads((straight / "test_predictions.json").read_text())) == 32


def test_ctrl_c_exits_130_with_a_resume_hint_and_the_rerun_follows_the_uninterrupted_run(vqa_root, tmp_path, capsys,
                                                                                          ctrl_c_on_call):
    root, _, _ = vqa_root
    straight, out = tmp_path / "straight", tmp_path / "run"
    variant = ["--variant", "span", "train.epochs=2", "train.checkpoint_every=5"]
    assert lxmert_train.main(_train_args(root, straight, *variant)) == 0
    argv = _train_args(root, out, *variant)
    restore = ctrl_c_on_call(lxmert_training.LxmertTask, "train_step", 6)  # 4 updates an epoch (32 questions / 8)
    capsys.readouterr()
    assert lxmert_train.main(argv) == 130
    restore()
    err = capsys.readouterr().err.splitlines()
    # the update in progress ends and is saved beside the kept checkpoints
    assert f"LXMERT span: update 6 saved to {out / 'checkpoints' / 'step_6.pt'}" in err
    assert err[-1] == "interrupted at LXMERT span update 6/8; re-run the same command to resume"
    assert [p.name for p in Checkpointer(out).paths()] == ["step_4.pt", "step_5.pt", "step_6.pt"]
    assert not (out / "results.json").exists()
    assert lxmert_train.main(argv) == 0
    err = capsys.readouterr().err
    assert "resuming from update 6 (epoch 2)" in err and "epoch 2/2 (update 8)" in err and "epoch 1/2" not in err
    kept = [[p.name for p in Checkpointer(run).paths()] for run in (straight, out)]
    assert kept[0] == kept[1] == ["step_5.pt", "step_8.pt"]  # the Ctrl-C checkpoint went with the next one
    a, b = _weights(straight), _weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _curve(out) == _curve(straight) and [r["step"] for r in _curve(out)] == list(range(1, 9))
    records = [json.loads((run / "results.json").read_text()) for run in (straight, out)]
    assert records[0]["epochs"] == records[1]["epochs"] and records[1]["steps"] == 8


def test_missing_pretrained_directory_is_a_clear_cli_error(vqa_root, tmp_path, capsys):
    root, _, _ = vqa_root
    args = ["--data-root", str(root), "--out", str(tmp_path / "run"), "--no-progress",
            "data.answers=vqa/mcan/answer_dict.json", "data.vocab=vocab.txt", "--pretrained", str(tmp_path / "none")]
    assert lxmert_train.main(args) == 2
    err = capsys.readouterr().err
    assert "none/config.json (model.pretrained) does not exist" in err and "huggingface-cli download" in err


def test_without_data_one_line_names_every_missing_input_the_weights_and_questions_too(tmp_path, capsys):
    assert lxmert_train.main(["--data-root", str(tmp_path), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "run").exists()
    for key in ("data.answers", "data.vocab", "data.splits.train.questions", "data.splits.train.annotations",
                "data.splits.train.features", "data.splits.val.questions", "model.pretrained", "model.answer_table"):
        assert f" ({key})" in err
    assert f"{tmp_path}/vqa/lxmert/lxmert-base-uncased/config.json (model.pretrained) does not exist" in err
    assert f"{tmp_path}/vqa/v2_OpenEnded_mscoco_train2014_questions.json (data.splits.train.questions)" in err
    assert "huggingface-cli download" in err and "https://visualqa.org/download.html" in err


def test_a_batch_larger_than_the_data_is_an_error_before_anything_is_written(vqa_root, tmp_path, capsys):
    root, _, _ = vqa_root
    assert lxmert_train.main(_train_args(root, tmp_path / "run", "train.batch_size=33")) == 2
    assert capsys.readouterr().err == (
        "error: an epoch would make no update: train.batch_size=33 exceeds the 32 training questions of "
        "data.train_splits ['train'] and the last partial batch is dropped; set train.batch_size=32 or less\n")
    assert not (tmp_path / "run").exists()


def test_demo_fine_tunes_a_random_tiny_lxmert_on_written_data_and_says_so(tmp_path, capsys):
    out = tmp_path / "demo"
    assert lxmert_train.main(["--demo", "--out", str(out), "--no-progress", "train.epochs=1"]) == 0
    err = capsys.readouterr().err
    assert "demo: a tiny LXMERT (softmax) with RANDOM weights, not the pretrained checkpoint" in err
    results = json.loads((out / "results.json").read_text())
    assert results["pretrained"] is None and results["config"]["data_root"] == str(out / "data")
    assert results["steps"] == 6 and results["final_eval"]["overall"] > 0   # 200 questions, batches of 32
    assert (out / "data" / "vqa" / "wordpieces.txt").read_text().startswith("[PAD]\n")
    assert lxmert_train.main(["--demo", "--out", str(tmp_path / "other"), "model.random_init.vocab_size=20"]) == 2
    assert "model.random_init.vocab_size=20 is smaller than the demo's 54 word pieces" in capsys.readouterr().err


def test_unknown_variant_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown variant 'sparse'.*'entmax'"):
        lxmert_train.load_config("sparse")


def test_packaged_variants_build_their_adaptations():
    span = lxmert_prepare.adaptation_of(lxmert_train.load_config("span"))
    assert (span.span.language.max_span, span.span.vision.max_span, span.span.init) == (20, 36, 1.0)
    layerdrop = lxmert_prepare.adaptation_of(lxmert_train.load_config("layerdrop"))
    assert (layerdrop.layerdrop.language, layerdrop.layerdrop.vision, layerdrop.layerdrop.cross) == (1, 1, 1)
    entmax = lxmert_prepare.adaptation_of(lxmert_train.load_config("entmax", ["optim.name=adamw"]))
    assert entmax.normalizer == "entmax" and entmax.normalizer_options == {"alpha": 1.5}
