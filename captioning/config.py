"""Configs (``captioning/configs/att2in.yaml`` + user YAML + ``key=value``), data paths and model building."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils import default_data_root
from common.utils.config import (PROBABILITY, POSITIVE, Rule, at_least, layer_configs, packaged_config, place_demo,
                                 to_dict)

from .metrics import METRICS
from .prepare import SPLITS, default_prepared_dir

if TYPE_CHECKING:  # the model is imported once the command line and config have been checked
    from common.text import Vocabulary

    from .models import Att2in

__all__ = ["RULES", "build_model", "data_path", "default_prepared_dir", "load_config", "prepared_dir", "run_dir",
           "to_dict"]

#: Ranges and choices of the captioning keys (beyond :data:`common.utils.config.RULES`).
RULES = {
    "model.embed_dim": at_least(1), "model.rnn_size": at_least(1), "model.att_hidden": at_least(1),
    "optim.decay_every": at_least(1), "optim.grad_clip_value": POSITIVE, "scheduled_sampling.increase_every": at_least(1),
    "scheduled_sampling.increase_prob": PROBABILITY, "scheduled_sampling.max_prob": PROBABILITY,
    "train.seq_per_img": at_least(1), "eval.split": Rule(choices=SPLITS), "eval.max_images": at_least(1),
    "eval.every": at_least(0), "eval.beam_size": at_least(1), "eval.length_penalty": at_least(0),
    "eval.batch_size": at_least(1), "eval.max_length": at_least(1),
    "eval.metrics": Rule(choices=METRICS, required=("cider",)),  # val CIDEr picks best.pt
}


def load_config(attention: Optional[str] = None, overrides: Sequence[str] = (),
                config_file: Optional[str] = None, demo: bool = False) -> DictConfig:
    """The packaged config with ``config_file`` and ``overrides`` merged over it (unknown keys are
    errors, except among ``attention.options``). ``demo``: ``configs/demo.yaml`` first, the run in
    ``out_dir`` (default ``runs/captioning/demo/<attention>``) and its synthetic data in ``<out_dir>/data``."""
    overrides = list(overrides) + ([f"attention.name={attention}"] if attention else [])
    base = packaged_config("captioning", "att2in.yaml")
    if demo:
        base = OmegaConf.merge(base, packaged_config("captioning", "demo.yaml"))
    cfg = layer_configs(base, config_file, overrides, open_keys=("attention.options",),
                        defaults_name="captioning/configs/att2in.yaml", rules=RULES)
    if demo:
        place_demo(cfg, Path("runs") / "captioning" / "demo" / cfg.attention.name)
    return cfg


def data_path(cfg: DictConfig, relative: str) -> Path:
    """``relative`` (a ``data.*`` entry) under the data root, unless it is absolute."""
    path = Path(relative).expanduser()
    return path if path.is_absolute() else default_data_root(cfg.data_root) / path


def prepared_dir(cfg: DictConfig) -> Path:
    """The prepared captions of a run: ``data.prepared`` (relative to the data root), else the default."""
    return data_path(cfg, cfg.data.prepared) if cfg.data.prepared else default_prepared_dir(cfg.data_root)


def run_dir(cfg: DictConfig) -> Path:
    return Path(cfg.out_dir) if cfg.out_dir else Path("runs") / "captioning" / cfg.attention.name


def build_model(cfg: DictConfig, vocab: Vocabulary, feature_dim: int) -> Att2in:
    """The Att2in of ``cfg.model`` / ``cfg.attention`` for ``vocab`` and ``feature_dim``-d regions."""
    from .models import Att2in, Att2inConfig

    model_cfg = Att2inConfig(vocab_size=len(vocab), feature_dim=feature_dim, attention=cfg.attention.name,
                             attention_options=OmegaConf.to_container(cfg.attention.options), **cfg.model)
    return Att2in(model_cfg, bos=vocab.bos, pad=vocab.pad)


#: Config keys that may change between a run and its resumption (where files go, speed knobs, length).
RESUMABLE_KEYS = ("data_root", "out_dir", "device", "eval", "train.num_threads", "train.num_workers", "train.epochs",
                  "train.precision", "train.compile")
