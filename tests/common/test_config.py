"""Packaged YAML + user file + key=value overrides, with errors for unknown keys."""
import pytest
from omegaconf import OmegaConf

from common.utils.config import layer_configs, packaged_config, parse_overrides, to_dict


def test_layers_apply_in_order_and_unknown_keys_fail(tmp_path):
    base = OmegaConf.create({"optim": {"lr": 0.005, "weight_decay": 5e-4}, "attention": {"name": "softmax", "options": {}}})
    user = tmp_path / "user.yaml"
    user.write_text("optim:\n  lr: 0.01\n")
    cfg = layer_configs(base, str(user), ["optim.weight_decay=0.001", "attention.options.k=3"],
                        open_keys=["attention.options"])
    assert to_dict(cfg) == {"optim": {"lr": 0.01, "weight_decay": 0.001}, "attention": {"name": "softmax", "options": {"k": 3}}}
    assert base.optim.lr == 0.005  # the base is not modified
    with pytest.raises(ValueError, match=r"^command line: unknown key optim.lrr; did you mean optim.lr\? "
                                         r"\(the keys are those of gat.yaml\)$"):
        layer_configs(base, overrides=["optim.lrr=0.1"], defaults_name="gat.yaml")


def test_bad_override_syntax_and_missing_packaged_file():
    with pytest.raises(ValueError, match="use key=value"):
        parse_overrides(["optim.lr"])
    with pytest.raises(FileNotFoundError, match="graphattn/configs/nope.yaml does not exist; available: .*gat.yaml"):
        packaged_config("graphattn", "nope.yaml")
    assert packaged_config("graphattn", "gat.yaml").model.heads == 8


def test_config_changes_name_each_differing_key_except_resumable_ones():
    from common.utils.config import check_resumable, config_changes
    saved = {"out_dir": "a", "optim": {"lr": 0.1, "betas": [0.9, 0.98]}, "train": {"epochs": 3, "threads": 1}}
    same_run = {"out_dir": "b", "optim": {"lr": 0.1, "betas": [0.9, 0.98]}, "train": {"epochs": 9, "threads": 2}}
    assert config_changes(saved, same_run, ["out_dir", "train.epochs", "train.threads"]) == {}
    other = {"out_dir": "a", "optim": {"lr": 0.2, "betas": [0.9, 0.98]}, "train": {"epochs": 3, "threads": 1},
             "model": {"layers": 2}}
    assert config_changes(saved, other, ["train"]) == {"optim.lr": (0.1, 0.2), "model.layers": (None, 2)}
    with pytest.raises(ValueError, match=r"runs/x holds a run with a different config \(model.layers: None -> 2; "
                                         r"optim.lr: 0.1 -> 0.2\)"):
        check_resumable(saved, other, ["train"], "runs/x")


BASE = {"seeds": 10, "optim": {"lr": 0.005, "betas": [0.9, 0.98]}, "kl": {"weight": 0.0, "schedule": "constant"},
        "train": {"sparse": True, "max_epochs": 100, "num_threads": None, "precision": "fp32"},
        "model": {"heads": 8}, "attention": {"name": "softmax", "options": {}}}


@pytest.mark.parametrize("override, message", [
    ("kl.weight=abc", "command line: kl.weight='abc': expected a number (float) like 0.0, got a string"),
    ("optim.lr=", "command line: optim.lr=: expected a number (float) like 0.005, got nothing"),
    ("train.max_epochs=1.5", "command line: train.max_epochs=1.5: expected an integer like 100, got a number (float)"),
    ("train.sparse=3", "command line: train.sparse=3: expected a boolean (true or false) like True, got an integer"),
    ("optim.betas=0.9", "command line: optim.betas=0.9: expected a list, got a number (float)"),
    ("model=3", "command line: model=3: expected a mapping, got an integer"),
    ("model.heads.k=3", "command line: model.heads={'k': 3}: expected an integer like 8, got a mapping"),
    ("seeds=0", "seeds=0: expected a number >= 1"),
    ("seeds=-1", "seeds=-1: expected a number >= 1"),
    ("optim.lr=0", "optim.lr=0: expected a number > 0"),
    ("kl.schedule=cosine", "kl.schedule='cosine': expected one of constant, linear, sigmoid"),
    ("train.precision=fp8", "train.precision='fp8': expected one of fp32, bf16, fp16"),
    ("train.num_threads=abc", "train.num_threads='abc': expected a number"),
])
def test_each_bad_override_names_the_key_the_value_and_what_is_expected(override, message):
    with pytest.raises(ValueError) as err:
        layer_configs(OmegaConf.create(BASE), overrides=[override], open_keys=["attention.options"])
    assert str(err.value) == message


def test_good_values_pass_the_type_and_range_checks():
    cfg = layer_configs(OmegaConf.create(BASE), overrides=[
        "optim.lr=1", "kl.weight=0.5", "train.num_threads=2", "train.num_threads=null", "optim.betas=[0.8,0.9]",
        "attention.options.k=3", "attention.name=bam-wc", "kl.schedule=sigmoid"], open_keys=["attention.options"])
    assert cfg.optim.lr == 1 and cfg.train.num_threads is None and cfg.attention.options.k == 3


def test_a_domain_adds_its_own_rules():
    from common.utils.config import Rule
    with pytest.raises(ValueError, match=r"^model.heads=3: expected one of 1, 2, 4, 8$"):
        layer_configs(OmegaConf.create(BASE), overrides=["model.heads=3"], rules={"model.heads": Rule(choices=(1, 2, 4, 8))})


def test_config_file_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^--config missing.yaml: no such file$"):
        layer_configs(OmegaConf.create(BASE), "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: [unclosed\n")
    with pytest.raises(ValueError, match="not a valid YAML file"):
        layer_configs(OmegaConf.create(BASE), str(bad))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("- 1\n")
    with pytest.raises(ValueError, match="expected a mapping of config keys"):
        layer_configs(OmegaConf.create(BASE), str(scalar))
    typed = tmp_path / "typed.yaml"
    typed.write_text("kl:\n  weight: high\n")
    with pytest.raises(ValueError, match=rf"^--config {typed}: kl.weight='high': expected a number"):
        layer_configs(OmegaConf.create(BASE), str(typed))


@pytest.mark.parametrize("name, loader", [
    ("gat", lambda: __import__("graphattn.config").config.load_config("cora", "bam-wc")),
    ("lstm-cpu", lambda: __import__("mt.config").config.load_config("lstm-cpu")),
    ("transformer-base", lambda: __import__("mt.config").config.load_config("transformer-base")),
    ("att2in", lambda: __import__("captioning.config").config.load_config()),
    ("mcan", lambda: __import__("vqa.config").config.load_config()),
    ("lxmert", lambda: __import__("vqa.lxmert.config").lxmert.config.load_config("bam")),
])
def test_packaged_configs_pass_their_own_checks(name, loader):
    assert loader() is not None


@pytest.mark.parametrize("override, message", [
    ("train.select=ppl", "train.select='ppl': expected one of bleu, loss"),
    ("eval.beam=0", "eval.beam=0: expected a number >= 1"),
    ("dataset=wmt14", "dataset='wmt14': expected one of demo, iwslt14, multi30k"),
])
def test_translation_adds_its_ranges_and_choices(override, message):
    from mt.config import load_config

    with pytest.raises(ValueError) as err:
        load_config("lstm-cpu", [override])
    assert str(err.value) == message


def _gat(overrides):
    return __import__("graphattn.config").config.load_config("cora", "bam-wc", overrides)


def _att2in(overrides):
    return __import__("captioning.config").config.load_config(overrides=overrides)


def _mcan(overrides):
    return __import__("vqa.config").config.load_config(overrides)


def _lxmert(overrides):
    return __import__("vqa.lxmert.config").lxmert.config.load_config("span", overrides)


@pytest.mark.parametrize("load, override, message", [
    (_gat, "model.dropout=1", "model.dropout=1: expected a number >= 0 and < 1"),
    (_gat, "model.value_dropout=-0.1", "model.value_dropout=-0.1: expected a number >= 0 and < 1"),
    (_gat, "model.heads=0", "model.heads=0: expected a number >= 1"),
    (_gat, "model.hidden_channels=0", "model.hidden_channels=0: expected a number >= 1"),
    (_gat, "kl.reduction=mean", "kl.reduction='mean': expected one of layer_sum, head_mean"),
    (_att2in, "model.rnn_size=0", "model.rnn_size=0: expected a number >= 1"),
    (_att2in, "scheduled_sampling.max_prob=1.5", "scheduled_sampling.max_prob=1.5: expected a number >= 0 and <= 1"),
    (_att2in, "optim.decay_rate=0", "optim.decay_rate=0: expected a number > 0"),
    (_att2in, "eval.split=dev", "eval.split='dev': expected one of train, restval, val, test"),
    (_att2in, "eval.metrics=[bleu,wer]",
     "eval.metrics=['bleu', 'wer']: expected a list of bleu, meteor, rouge, cider, spice with cider"),
    (_att2in, "eval.metrics=[bleu]",  # val CIDEr chooses the best checkpoint
     "eval.metrics=['bleu']: expected a list of bleu, meteor, rouge, cider, spice with cider"),
    (_att2in, "train.seq_per_img=0", "train.seq_per_img=0: expected a number >= 1"),
    (_mcan, "model.layers=0", "model.layers=0: expected a number >= 1"),
    (_mcan, "optim.eps=0", "optim.eps=0: expected a number > 0"),
    (_mcan, "data.max_regions=0", "data.max_regions=0: expected a number >= 1"),
    (_mcan, "train.epochs=0", "train.epochs=0: expected a number >= 1"),
    (_lxmert, "optim.name=sgd", "optim.name='sgd': expected one of lamb_lookahead, adamw"),
    (_lxmert, "optim.lookahead_alpha=0", "optim.lookahead_alpha=0: expected a number > 0 and <= 1"),
    (_lxmert, "optim.grad_clip=-1", "optim.grad_clip=-1: expected a number >= 0"),
    (_lxmert, "train.checkpoint_every=0", "train.checkpoint_every=0: expected a number >= 1"),
    (_lxmert, "model.adaptation.layerdrop.vision=-1", "model.adaptation.layerdrop.vision=-1: expected a number >= 0"),
])
def test_each_domain_checks_the_ranges_and_choices_of_its_keys(load, override, message):
    with pytest.raises(ValueError) as err:
        load([override])
    assert str(err.value) == message


def test_lxmert_normalizers_are_the_registry_names():
    from common.attention import available

    with pytest.raises(ValueError) as err:
        _lxmert(["model.adaptation.normalizer=sofmax"])
    assert str(err.value) == f"model.adaptation.normalizer='sofmax': expected one of {', '.join(available())}"
    assert _lxmert(["model.adaptation.normalizer=entmax15"]).model.adaptation.normalizer == "entmax15"


KNOWN = ["optim", "optim.lr", "optim.weight_decay", "train", "train.max_epochs", "train.log_every", "loader",
         "loader.batch_size", "eval.batch_size", "model.heads"]


@pytest.mark.parametrize("key, expected", [
    ("train.lr", ["optim.lr"]),  # the last part alike: another section's key
    ("optim.lrr", ["optim.lr"]),
    ("trian.max_epochs", ["train.max_epochs"]),  # the whole path alike
    ("model.head", ["model.heads"]),
    ("loader.batch_sise", ["loader.batch_size", "eval.batch_size"]),  # the whole path's match first
    ("zzz", []),
])
def test_close_keys_match_whole_paths_and_last_parts(key, expected):
    from common.utils.config import close_keys

    assert close_keys(key, KNOWN) == expected


def test_an_unknown_key_is_one_line_with_the_closest_keys(tmp_path):
    base = OmegaConf.create(BASE)
    with pytest.raises(ValueError) as err:
        layer_configs(base, overrides=["train.lr=abc"], open_keys=["attention.options"], defaults_name="gat.yaml")
    assert str(err.value) == ("command line: unknown key train.lr; did you mean optim.lr? "
                              "(the keys are those of gat.yaml)")
    user = tmp_path / "user.yaml"
    user.write_text("train:\n  max_epoch: 3\n")
    with pytest.raises(ValueError) as err:
        layer_configs(base, str(user), defaults_name="gat.yaml")
    assert str(err.value) == (f"--config {user}: unknown key train.max_epoch; did you mean train.max_epochs? "
                              f"(the keys are those of gat.yaml)")
    with pytest.raises(ValueError) as err:
        layer_configs(base, overrides=["zzz=1"], defaults_name="gat.yaml")
    assert str(err.value) == "command line: unknown key zzz; the keys are those of gat.yaml"
    assert layer_configs(base, overrides=["attention.options.zzz=1"], open_keys=["attention.options"]) \
        .attention.options.zzz == 1  # an open key takes new keys


TRAIN_CLIS = {  # CLI -> the options it needs to reach its config
    "graphattn.train": ["--dataset", "Cora"], "mt.train": ["--preset", "demo"], "captioning.train": ["--demo"],
    "vqa.train": ["--demo"], "vqa.lxmert.train": ["--demo"], "tagging.train": [], "nlu.train": ["--task", "RTE"],
}


@pytest.mark.parametrize("module", sorted(TRAIN_CLIS))
@pytest.mark.parametrize("in_file", [False, True], ids=["command-line", "config-file"])
def test_each_train_cli_answers_a_mistyped_key_with_one_line_and_the_key_meant(module, in_file, tmp_path, capsys):
    import importlib

    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  lr: 0.01\n")
    args = ["--config", str(typo)] if in_file else ["train.lr=0.01"]
    code = importlib.import_module(module).main([*TRAIN_CLIS[module], "--out", str(tmp_path / "run"), *args])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    source = f"--config {typo}" if in_file else "command line"
    assert lines[0].startswith(f"error: {source}: unknown key train.lr; did you mean optim.lr? ")
    assert not (tmp_path / "run").exists()
