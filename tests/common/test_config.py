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
    with pytest.raises(ValueError, match=r"command line: Key 'lrr' is not in struct(.|\n)*Known keys are those of gat.yaml"):
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
