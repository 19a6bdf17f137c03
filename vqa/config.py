"""Configs of MCAN training: ``vqa/configs/mcan_small.yaml`` <- ``--config`` file <- ``key=value`` overrides
(``mcan_demo.yaml`` first for ``--demo``), and the run directory. Importing it imports no torch:
``python -m vqa.train`` checks its config before the model is loaded."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import at_least, layer_configs, packaged_config, place_demo, to_dict

__all__ = ["CONFIG_NAME", "RULES", "default_out_dir", "load_config", "to_dict"]

CONFIG_NAME = "mcan_small.yaml"

#: Ranges of the MCAN keys (beyond :data:`common.utils.config.RULES`).
RULES = {"optim.warmup_epochs": at_least(0), **{key: at_least(1) for key in (
    "data.max_question_len", "data.min_word_count", "model.feature_dim", "model.word_dim", "model.hidden", "model.ffn",
    "model.layers", "model.flat_mlp", "model.flat_glimpses", "model.flat_out")}}


def load_config(overrides: Sequence[str] = (), config_file: Optional[str] = None, demo: bool = False) -> DictConfig:
    """``vqa/configs/mcan_small.yaml`` <- ``--config`` file <- ``key=value`` overrides. ``demo``:
    ``vqa/configs/mcan_demo.yaml`` first, the run in ``out_dir`` (default ``runs/vqa/mcan/demo/<attention>``)
    and its synthetic data in ``<out_dir>/data``."""
    base = packaged_config("vqa", CONFIG_NAME)
    if demo:
        base = OmegaConf.merge(base, packaged_config("vqa", "mcan_demo.yaml"))
    cfg = layer_configs(base, config_file, overrides, open_keys=("attention.options", "data.splits"),
                        defaults_name=f"vqa/configs/{CONFIG_NAME}", rules=RULES)
    if demo:
        place_demo(cfg, Path("runs") / "vqa" / "mcan" / "demo" / cfg.attention.name)
    return cfg


def default_out_dir(cfg: DictConfig) -> Path:
    """``out_dir``, else ``runs/vqa/mcan/<attention>``."""
    return Path(cfg.out_dir) if cfg.out_dir else Path("runs") / "vqa" / "mcan" / cfg.attention.name


#: Config keys that may change between a run and its resumption (where files go, speed knobs, the epochs).
RESUMABLE_KEYS = ("data_root", "out_dir", "device", "train.epochs", "train.num_workers", "train.num_threads",
                  "train.eval_batch_size", "train.log_every", "train.precision", "train.compile")
