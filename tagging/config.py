"""Configs: ``tagging/configs/tagging.yaml``, then a user YAML (``--config``), then ``key=value`` overrides."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import (DROPOUT, Rule, at_least, layer_configs, packaged_config, packaged_preset,
                                 preset_deviations)

#: The treebanks of the paper's 47 (``pdufter/convatt`` ``ud_parallel.py``) staged under ``<data_root>/ud``.
PAPER_TREEBANKS = ("UD_Afrikaans-AfriBooms", "UD_English-GUM", "UD_English-LinES", "UD_French-Sequoia",
                   "UD_French-Spoken", "UD_Gothic-PROIEL", "UD_Greek-GDT", "UD_Hungarian-Szeged",
                   "UD_Old_Church_Slavonic-PROIEL", "UD_Swedish-LinES", "UD_Vietnamese-VTB")
#: The packaged presets (``tagging/configs/<name>.yaml``): the defaults, and the authors' initialisation and vocabulary.
PRESETS = ("standard", "official")
#: The variants' keys (tagging.model.VARIANTS), listed here so that the command line is checked without torch.
VARIANT_NAMES = ("pe-add", "pe-con", "p", "r", "pr", "temp", "conv1d", "conv2d")

RULES = {"variant": Rule(choices=VARIANT_NAMES), "data.max_len": at_least(1), "data.max_word_chars": at_least(1),
         "data.vocab_fraction": Rule(low=0, high=1, low_open=True),
         "data.vocab_splits": Rule(choices=("all", "train")),
         "model.init": Rule(choices=("keras", "torch")), "model.word_dim": at_least(1),
         "model.char_dim": at_least(1), "model.char_layers": at_least(1), "model.char_kernel": at_least(1),
         "model.concat_position_dim": at_least(1), "model.layers": at_least(1), "model.heads": at_least(1),
         "model.dropout": DROPOUT, "train.batch_size": at_least(1), "train.max_epochs": at_least(1),
         "train.patience": at_least(1), "train.curve_every": at_least(1), "train.mc_samples": at_least(0),
         "train.precision": Rule(choices=("fp32", "bf16", "fp16"))}


def load_config(overrides: Sequence[str] = (), config_file: Optional[str] = None, preset: Optional[str] = None
                ) -> DictConfig:
    """The resolved, checked config: the defaults, the ``preset`` (``--preset``), the ``--config`` file and
    ``key=value`` overrides, in that order."""
    base = packaged_config("tagging", "tagging.yaml")
    if preset is not None:
        base = OmegaConf.merge(base, packaged_preset("tagging", preset, PRESETS))
        base.preset = preset
    cfg = layer_configs(base, config_file, overrides, open_keys=["attention.options"],
                        defaults_name="tagging/configs/tagging.yaml", rules=RULES)
    width = cfg.model.word_dim + cfg.model.char_dim + (cfg.model.concat_position_dim if cfg.variant == "pe-con" else 0)
    if width % cfg.model.heads:
        raise ValueError(f"model.heads={cfg.model.heads} must divide the input width {width} (word_dim + char_dim"
                         f"{' + concat_position_dim' if cfg.variant == 'pe-con' else ''})")
    return cfg


def deviations(cfg: DictConfig) -> Dict[str, dict]:
    """The keys where ``cfg`` differs from what its preset sets, ``{key: {"preset": .., "run": ..}}``."""
    return preset_deviations(cfg, packaged_preset("tagging", cfg.preset, PRESETS))


def default_out_dir(cfg: DictConfig) -> Path:
    if cfg.out_dir:
        return Path(cfg.out_dir)
    name = cfg.variant if cfg.attention.name == "softmax" else f"{cfg.variant}-{cfg.attention.name}"
    return Path("runs") / "tagging" / Path(str(cfg.treebank)).name / name


#: Keys that may differ when a run resumes (they do not change what is computed).
RESUMABLE_KEYS = ("device", "out_dir", "data_root", "seeds", "train.num_threads")
