"""``nlu.train`` / ``nlu.training.run`` end to end on a tiny random BERT saved locally (no network): it overfits
16 real RTE pairs with softmax, BAM-WC and entmax; Ctrl-C and a rerun give the uninterrupted results; finished
seeds are reused and a changed config is refused; the CLI's one-line errors; ``--preset official`` (the
authors' settings per task, its two arms, what a run changes recorded), gradient accumulation and a number of
updates that ends an epoch part-way (resumed exactly too), and what ``kl.detach`` does to the prior network's
gradient.

The checkpoint (``save_pretrained``): a BertTokenizer over a whole-word vocabulary of the 16 pairs and a
``BertForSequenceClassification`` of 2 layers, width 32, 4 heads. The 16 pairs are the first of the real RTE
train file, written back in the official layout as both train.tsv and dev.tsv (dev accuracy = train accuracy).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import List, Sequence

import pytest
import torch

from common.training import TrainState
from common.utils.checkpoint import Checkpointer
from common.utils.logger import read_metrics

from nlu import train, training
from nlu import model as nlu_model
from nlu.model import GlueData, attention_dropout
from common.utils.runtime import Runtime

from nlu.config import deviations, load_config
from nlu.data import read_split
from nlu.tasks import get_task

PAIRS = 16
PER_EPOCH = 2  # 16 pairs in batches of 8
#: Settings under which the tiny model reaches 100% on the 16 pairs by epoch 8-10 (seeds 0-2, every normalizer).
OVERFIT = ("train.epochs=16", "optim.lr=5e-3", "optim.warmup_ratio=0", "train.checkpoint_every=1000")


def write_tiny_bert(directory: Path, texts: Sequence[str], seed: int = 0) -> Path:
    """A random 2-layer BERT classifier and a whole-word tokenizer of ``texts``, saved as a HF checkpoint."""
    from tokenizers.pre_tokenizers import BertPreTokenizer
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    pre = BertPreTokenizer()
    words = sorted({word for text in texts for word, _ in pre.pre_tokenize_str(text.lower())})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    directory.mkdir(parents=True)
    BertTokenizer(vocab={word: i for i, word in enumerate(vocab)}).save_pretrained(directory)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128)  # dropout 0.1, attention's too
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def write_rte(directory: Path, rows: List[tuple], splits=("train", "dev")) -> None:
    """``rows`` of (sentence1, sentence2, label) as the official RTE files (index, sentence1, sentence2, label)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["index\tsentence1\tsentence2\tlabel", *(f"{i}\t{a}\t{b}\t{label}" for i, (a, b, label) in enumerate(rows))]
    for split in splits:
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def rte16(tmp_path_factory, attn_data_root):
    """(model directory, data root holding glue/RTE/) for the first 16 real RTE training pairs."""
    split = read_split("RTE", "train", attn_data_root)
    labels = ("entailment", "not_entailment")
    rows = [(a, b, labels[y]) for a, b, y in zip(split.text_a[:PAIRS], split.text_b[:PAIRS], split.labels[:PAIRS])]
    root = tmp_path_factory.mktemp("rte16")
    write_rte(root / "data" / "glue" / "RTE", rows)
    threads = torch.get_num_threads()
    model = write_tiny_bert(root / "tiny-bert", [text for a, b, _ in rows for text in (a, b)])
    torch.set_num_threads(threads)
    return model, root / "data"


@pytest.fixture(scope="module")
def toy_bert(tmp_path_factory) -> Path:
    """A tiny checkpoint that needs no data (for the errors raised after the model is loaded)."""
    return write_tiny_bert(tmp_path_factory.mktemp("toy") / "tiny-bert", ["a man is eating .", "nobody eats ."])


def settings(model: Path, data_root: Path, out: Path, *extra: str) -> List[str]:
    return ["task=RTE", f"model={model}", f"data_root={data_root}", f"out_dir={out}", "device=cpu",
            "train.num_threads=1", "train.batch_size=8", *extra]


def run(overrides: List[str], preset=None) -> dict:
    """``training.run`` with one torch thread, the caller's thread count restored afterwards."""
    threads = torch.get_num_threads()
    try:
        return training.run(load_config(overrides, preset=preset), progress=False)
    finally:
        torch.set_num_threads(threads)


def cli(*args: str) -> int:
    threads = torch.get_num_threads()
    try:
        return train.main([*args, "--threads", "1", "--device", "cpu", "--no-progress"])
    finally:
        torch.set_num_threads(threads)


def without_time(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "train_seconds"}


# --------------------------------------------------------------------------------------------- overfitting ----
@pytest.mark.realdata
@pytest.mark.parametrize("normalizer", ["softmax", "bam-wc", "entmax"])
def test_a_tiny_random_bert_overfits_16_real_rte_pairs(rte16, tmp_path, capsys, normalizer):
    model, data_root = rte16
    out = tmp_path / "run"
    code = cli("--task", "rte", "--model", str(model), "--data-root", str(data_root), "--out", str(out),
               "--attention", normalizer, "train.batch_size=8", *OVERFIT)
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "RTE" and results["seeds"] == [0] and results["normalizer"] == normalizer
    assert results["examples"] == {"train": PAIRS, "dev": PAIRS}
    assert results["dev"]["accuracy"] == {"mean": 100.0, "std": 0.0, "n": 1}, results["per_seed"][0]["curve"]
    (seed,) = results["per_seed"]
    assert (seed["updates"], seed["updates_per_epoch"]) == (16 * PER_EPOCH, PER_EPOCH)
    assert [(p["epoch"], p["step"]) for p in seed["curve"]] == [(e, e * PER_EPOCH) for e in range(1, 17)]
    assert seed["dev"] == seed["curve"][-1]["dev"] and (out / "seed0.json").exists()
    assert json.loads((out / "config.json").read_text())["attention"]["name"] == normalizer
    assert capsys.readouterr().out.startswith(f"RTE {normalizer}: dev accuracy 100.00 +- 0.00 over 1 seeds")
    kl = [r["train/kl"] for r in read_metrics(out / "seed0" / "metrics.jsonl", "train/kl")]
    assert len(kl) == 3  # updates 10, 20 and 30
    assert all(v > 0 for v in kl) if normalizer == "bam-wc" else kl == [0.0] * 3
    dev = read_metrics(out / "seed0" / "metrics.jsonl", "dev/accuracy")
    assert [(r["step"], r["epoch"]) for r in dev] == [(e * PER_EPOCH, e) for e in range(1, 17)]


@pytest.mark.realdata
def test_the_files_written_are_every_file_of_the_run(rte16, tmp_path, capsys, monkeypatch):
    model, data_root = rte16
    monkeypatch.chdir(tmp_path)
    code = cli("--task", "RTE", "--model", str(model), "--data-root", str(data_root), "--out", "run", "--seeds", "2",
               "train.epochs=1", "train.batch_size=8")
    assert code == 0, capsys.readouterr().err
    listed = capsys.readouterr().out.split("files written:\n", 1)[1].split()
    written = [f"run/{path.name}{'/' if path.is_dir() else ''}" for path in (tmp_path / "run").iterdir()]
    assert sorted(listed) == sorted(written) == ["run/config.json", "run/results.json", "run/seed0.json", "run/seed0/",
                                                 "run/seed1.json", "run/seed1/"]


# ------------------------------------------------------------------------------------------------- resume ----
RESUME = ("attention.name=bam-wc", "train.epochs=3", "optim.lr=5e-3")  # BAM-WC samples: the RNG must be restored


@pytest.fixture(scope="module")
def straight(rte16, tmp_path_factory):
    """An uninterrupted BAM-WC run checkpointing every update: (run directory, record)."""
    model, data_root = rte16
    out = tmp_path_factory.mktemp("straight") / "run"
    return out, run(settings(model, data_root, out, *RESUME, "train.checkpoint_every=1"))


def final_state(out: Path) -> dict:
    path = Checkpointer(out / "seed0").paths()[-1]  # the newest step
    return torch.load(path, weights_only=False)


@pytest.mark.realdata
@pytest.mark.parametrize("interrupt_at, how, saved_step", [
    (3, "sigint", 3),  # a Ctrl-C during the middle update of the run: that update ends, then it is saved
    (2, "sigint", 2),  # during epoch 1's last update: the rerun starts with epoch 1's dev evaluation
    (5, "raise", 4),   # KeyboardInterrupt from the first update of epoch 3: update 4 (epoch 2 evaluated) is saved
])
def test_ctrl_c_and_a_rerun_give_the_uninterrupted_results(rte16, straight, tmp_path, monkeypatch, ctrl_c_on_call,
                                                           interrupt_at, how, saved_step):
    model, data_root = rte16
    reference_dir, reference = straight
    out = tmp_path / "run"
    # no periodic checkpoint: the only mid-epoch one is written by the interruption
    overrides = settings(model, data_root, out, *RESUME, "train.checkpoint_every=1000")
    original = training.GlueTask.train_step
    if how == "sigint":
        restore = ctrl_c_on_call(training.GlueTask, "train_step", interrupt_at)
    else:
        calls = []

        def interrupted(self, indices, state):
            calls.append(1)
            if len(calls) == interrupt_at:
                raise KeyboardInterrupt
            return original(self, indices, state)

        monkeypatch.setattr(training.GlueTask, "train_step", interrupted)
        restore = lambda: monkeypatch.setattr(training.GlueTask, "train_step", original)  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        run(overrides)
    restore()
    saved = final_state(out)
    engine = saved["extra"]["engine"]
    assert saved["step"] == saved_step and engine["step"] == saved_step
    epoch = saved_step // PER_EPOCH if how == "raise" else (saved_step - 1) // PER_EPOCH
    assert (engine["epoch"], engine["batch"]) == (epoch, saved_step - PER_EPOCH * epoch)
    assert len(engine["history"]) == epoch  # the dev evaluations of the finished epochs
    assert not (out / "seed0.json").exists() and not (out / "results.json").exists()

    record = run(overrides)
    assert record["dev"] == reference["dev"]
    assert [without_time(r) for r in record["per_seed"]] == [without_time(r) for r in reference["per_seed"]]
    state, reference_state = final_state(out), final_state(reference_dir)
    assert state["step"] == reference_state["step"] == 3 * PER_EPOCH
    assert state["extra"]["task"]["last"]["loss"] == reference_state["extra"]["task"]["last"]["loss"]
    assert state["extra"]["task"]["last"]["kl"] == reference_state["extra"]["task"]["last"]["kl"] > 0
    for name, value in reference_state["model"].items():
        assert torch.equal(state["model"][name], value), name


@pytest.mark.realdata
def test_ctrl_c_in_the_last_update_of_a_part_epoch_resumes_exactly(rte16, tmp_path, ctrl_c_on_call):
    """Two batches of 4 per update, 3 updates: epoch 2 stops after its first update; a Ctrl-C during that last
    update saves it, and the rerun scores dev there as the uninterrupted run does."""
    model, data_root = rte16
    accumulated = (*RESUME, "train.batch_size=4", "train.accumulation=2", "train.max_updates=3")
    reference = run(settings(model, data_root, tmp_path / "straight", *accumulated))
    out = tmp_path / "run"
    restore = ctrl_c_on_call(training.GlueTask, "train_step", 3)
    with pytest.raises(KeyboardInterrupt):
        run(settings(model, data_root, out, *accumulated, "train.checkpoint_every=1000"))
    restore()
    saved = final_state(out)["extra"]["engine"]
    assert (saved["step"], saved["epoch"], saved["batch"], len(saved["history"])) == (3, 1, 1, 1)
    record = run(settings(model, data_root, out, *accumulated, "train.checkpoint_every=1000"))
    (seed,) = record["per_seed"]
    assert (seed["updates"], seed["updates_per_epoch"]) == (3, 2)
    assert [(p["epoch"], p["step"]) for p in seed["curve"]] == [(1, 2), (2, 3)]
    assert [without_time(r) for r in record["per_seed"]] == [without_time(r) for r in reference["per_seed"]]
    for name, value in final_state(tmp_path / "straight")["model"].items():
        assert torch.equal(final_state(out)["model"][name], value), name


@pytest.mark.realdata
def test_a_finished_seed_is_reused_and_resumable_keys_may_change(rte16, straight, tmp_path, monkeypatch):
    model, data_root = rte16
    reference_dir, reference = straight
    shutil.copytree(reference_dir, tmp_path / "run")

    def retrain(*args, **kwargs):
        raise AssertionError("a finished seed was trained again")

    monkeypatch.setattr(training.GlueTask, "__init__", retrain)
    record = run(settings(model, data_root, tmp_path / "run", *RESUME, "train.checkpoint_every=7",
                          "train.eval_batch_size=3"))
    assert record["per_seed"] == reference["per_seed"] and record["dev"] == reference["dev"]
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == json.loads(json.dumps(record))


@pytest.mark.realdata
@pytest.mark.parametrize("change, listed", [("optim.lr=1e-3", "optim.lr: 0.005 -> 0.001"),
                                            ("attention.name=softmax", "attention.name: 'bam-wc' -> 'softmax'")])
def test_a_changed_config_refuses_to_resume_and_names_the_key(rte16, straight, tmp_path, capsys, change, listed):
    model, data_root = rte16
    reference_dir, _ = straight
    out = tmp_path / "run"
    shutil.copytree(reference_dir, out)
    before = (out / "config.json").read_text()
    code = cli("--task", "RTE", "--model", str(model), "--data-root", str(data_root), "--out", str(out),
               "train.batch_size=8", "train.checkpoint_every=1", *RESUME, change)
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[-1].startswith(f"error: {out} holds a run with a different config ({listed}); choose another output "
                              f"directory (--out) or delete it")
    assert [line for line in err if "error" in line] == [err[-1]]
    assert (out / "config.json").read_text() == before


# --------------------------------------------------------------------------------------------- CLI errors ----
def one_error_line(capsys) -> str:
    """The CLI's stderr, which must be one line starting with ``error:`` (nothing on stdout)."""
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    return captured.err.rstrip("\n")


def test_a_missing_model_directory_exits_2_naming_it_and_the_fetch_command(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    code = cli("--task", "RTE", "--model", str(missing), "--data-root", str(tmp_path), "--out", str(tmp_path / "run"))
    assert code == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: --model {missing}: no such directory; ")
    assert "`python -m nlu.pretrained fetch`" in line
    assert not (tmp_path / "run").exists()


def test_a_bad_tsv_row_exits_2_naming_the_file_and_the_line(toy_bert, tmp_path, capsys):
    rte = tmp_path / "glue" / "RTE"
    write_rte(rte, [("A man is eating.", "Nobody eats.", "not_entailment")] * 4)
    lines = (rte / "train.tsv").read_text().splitlines()
    lines[3] = "2\tA man is eating.\tnot_entailment"  # line 4: three columns
    (rte / "train.tsv").write_text("\n".join(lines) + "\n")
    code = cli("--task", "RTE", "--model", str(toy_bert), "--data-root", str(tmp_path), "--out", str(tmp_path / "run"))
    assert code == 2
    assert one_error_line(capsys).startswith(f"error: {rte / 'train.tsv'}:4: row: expected 4 tab-separated columns "
                                             f"for RTE train, got 3; ")
    assert not (tmp_path / "run").exists()


def test_an_empty_train_file_exits_2_naming_it_before_the_tokenizer_loads(toy_bert, tmp_path, capsys, monkeypatch):
    rte = tmp_path / "glue" / "RTE"
    write_rte(rte, [("A man is eating.", "Nobody eats.", "not_entailment")])
    (rte / "train.tsv").write_text("")
    monkeypatch.setattr(nlu_model, "load_tokenizer", lambda *args: pytest.fail("the tokenizer was loaded"))
    code = cli("--task", "RTE", "--model", str(toy_bert), "--data-root", str(tmp_path), "--out", str(tmp_path / "run"))
    assert code == 2
    assert one_error_line(capsys).startswith(f"error: {rte / 'train.tsv'}: no RTE train examples: the file is empty; ")
    assert not (tmp_path / "run").exists()


def test_an_unknown_task_exits_2(tmp_path, capsys):
    code = cli("--task", "NoSuch", "--out", str(tmp_path / "run"))
    assert code == 2
    assert one_error_line(capsys) == ("error: unknown GLUE task 'NoSuch'; use one of CoLA, MRPC, RTE, STS-B, SST-2, "
                                      "WNLI (case-insensitive)")
    assert not (tmp_path / "run").exists()


def test_an_unknown_preset_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli("--preset", "nosuch", "--out", str(tmp_path / "run"))
    assert done.value.code == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert errors == ["python -m nlu.train: error: argument --preset: invalid choice: 'nosuch' (choose from "
                      "'standard', 'official')"]
    assert captured.err.splitlines()[-1] == errors[0] and captured.out == ""


# ---------------------------------------------------------------------------------------- official preset ----
#: The authors' settings (zhougroup/BAM run_glue_albert_mrpc.sh for MRPC; google-research/albert run_glue.sh for the
#: others): learning rate, warm-up updates, updates, batch size x accumulation.
AUTHORS = {"MRPC": (2e-5, 200, 800, 4, 2), "RTE": (3e-5, 200, 800, 32, 1), "CoLA": (1e-5, 320, 5336, 16, 1),
           "STS-B": (2e-5, 214, 3598, 16, 1)}


@pytest.mark.parametrize("task", sorted(AUTHORS))
def test_the_official_preset_holds_the_authors_settings(task):
    cfg = load_config([f"task={task}"], preset="official")
    o, t = cfg.optim, cfg.train
    assert (o.lr, o.warmup_updates, t.max_updates, t.batch_size, t.accumulation) == AUTHORS[task]
    assert (o.weight_decay, cfg.data.max_length, cfg.kl.weight, cfg.kl.detach) == (0.0, 512, 1.0, True)
    assert cfg.attention.name == "bam-wf"  # Weibull posterior, constant Gamma prior (--att_prior_type constant)
    assert dict(cfg.attention.options) == {"k": 10, "prior_alpha": 1e-4, "beta": 1e-4}
    assert attention_dropout(cfg.attention) == 0.0  # no attention dropout on the BAM path
    softmax = load_config([f"task={task}", "attention.name=softmax"], preset="official")
    assert dict(softmax.attention.options) == {} and attention_dropout(softmax.attention) is None
    assert (softmax.optim.lr, softmax.train.max_updates) == (o.lr, t.max_updates)  # the same recipe, other arm
    assert deviations(cfg) == deviations(softmax) == {}
    standard = load_config([f"task={task}"])  # the default: today's recipe
    assert (standard.preset, standard.optim.lr, standard.train.max_updates, standard.kl.detach) == (
        "standard", 5e-5, None, False)


def test_the_official_preset_refuses_a_task_without_the_authors_settings():
    with pytest.raises(ValueError, match=r"--preset official has no settings for WNLI .*use --preset standard"):
        load_config(["task=wnli"], preset="official")


@pytest.mark.realdata
def test_the_official_preset_is_recorded_with_what_the_run_changes(rte16, tmp_path, capsys):
    model, data_root = rte16
    out = tmp_path / "run"
    assert cli("--task", "RTE", "--preset", "official", "--model", str(model), "--data-root", str(data_root),
               "--out", str(out), "train.max_updates=3", "train.batch_size=8", "kl.detach=false") == 0, \
        capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())
    assert saved["preset"] == "official" and saved["attention"]["name"] == "bam-wf"
    results = json.loads((out / "results.json").read_text())
    assert results["preset"] == "official" and results["label"] == "bam-wf (official)"
    assert results["preset_deviations"] == {"kl.detach": {"preset": True, "run": False},
                                            "train.max_updates": {"preset": 800, "run": 3},
                                            "train.batch_size": {"preset": 32, "run": 8}}
    (seed,) = results["per_seed"]
    assert seed["updates"] == 3 and [(p["epoch"], p["step"]) for p in seed["curve"]] == [(1, 2), (2, 3)]
    assert "differs from --preset official in kl.detach=False (preset: True)" in capsys.readouterr().err


@pytest.mark.realdata
@pytest.mark.parametrize("normalizer, dropout", [("bam-wf", 0.0), ("softmax", 0.1)])
def test_the_official_preset_drops_attention_weights_only_on_the_softmax_arm(rte16, tmp_path, normalizer, dropout):
    from common.attention import Attend

    model, data_root = rte16
    cfg = load_config(settings(model, data_root, tmp_path / "run", f"attention.name={normalizer}"), preset="official")
    seed_run = training.GlueTask(cfg, GlueData.load(cfg, model), model, 0, tmp_path / "run",
                                Runtime.create("cpu", threads=torch.get_num_threads()))
    attends = [m for m in seed_run.model.modules() if isinstance(m, Attend)]
    assert len(attends) == 2 and {m.config.dropout for m in attends} == {dropout}


@pytest.mark.realdata
def test_an_update_of_two_batches_has_the_gradient_of_one_batch_of_both(rte16, tmp_path):
    model, data_root = rte16
    grads = []
    for batch, update in ((8, [list(range(8))]), (4, [list(range(4)), list(range(4, 8))])):
        cfg = load_config(settings(model, data_root, tmp_path / f"run{batch}", f"train.batch_size={batch}",
                                   "attention.dropout=0"))
        seed_run = training.GlueTask(cfg, GlueData.load(cfg, model), model, 0, tmp_path / f"run{batch}",
                                    Runtime.create("cpu", threads=torch.get_num_threads()))
        for module in seed_run.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        seed_run.train_step(update, TrainState())
        grads.append({name: p.grad.clone() for name, p in seed_run.model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.realdata
@pytest.mark.parametrize("detach", [True, False])
def test_a_detached_kl_gives_the_prior_network_no_gradient(rte16, tmp_path, detach):
    model, data_root = rte16
    cfg = load_config(settings(model, data_root, tmp_path / "run", "attention.name=bam-wc",
                               f"kl.detach={str(detach).lower()}"))
    threads = torch.get_num_threads()
    try:
        runtime = Runtime.create("cpu", threads=1)
        data = GlueData.load(cfg, model)
        seed_run = training.GlueTask(cfg, data, model, 0, tmp_path / "run", runtime)
        logged = seed_run.train_step([list(range(8))], TrainState())
        loss, kl = float(logged["train/loss"]), float(logged["train/kl"])
    finally:
        torch.set_num_threads(threads)
    assert kl > 0 and loss > 0
    prior = {name: p.grad for name, p in seed_run.model.named_parameters() if ".normalizer.prior_net." in name}
    assert len(prior) == 2 * 4  # 2 layers x (hidden, out) x (weight, bias)
    if detach:
        assert all(grad is None or not grad.any() for grad in prior.values())
    else:
        assert all(grad is not None for grad in prior.values()) and any(grad.any() for grad in prior.values())
    query = seed_run.model.bert.encoder.layer[0].attention.self.query.weight.grad
    assert query is not None and query.any()  # the task loss trains the rest either way


def test_a_half_precision_checkpoint_is_fine_tuned_in_float32(toy_bert, tmp_path):
    """transformers 5 keeps a checkpoint's dtype: a float16 checkpoint would train in float16 without a scaler."""
    from safetensors.torch import load_file
    from transformers import BertForSequenceClassification

    half = tmp_path / "half"
    shutil.copytree(toy_bert, half)
    BertForSequenceClassification.from_pretrained(toy_bert, dtype=torch.float16).save_pretrained(half)
    saved = load_file(half / "model.safetensors")
    assert {value.dtype for value in saved.values() if value.is_floating_point()} == {torch.float16}
    model, _ = nlu_model.load_classifier(half, get_task("RTE"), None)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    state = model.state_dict()
    encoder = {key: value for key, value in saved.items() if not key.startswith("classifier")}  # the head is new
    assert all(torch.equal(state[key], value.float()) for key, value in encoder.items())
