"""Configs of the LXMERT fine-tuning: ``vqa/configs/lxmert.yaml`` with ``variants.<variant>`` merged over
``model.adaptation`` <- ``--config`` file <- ``key=value`` overrides (``lxmert_demo.yaml`` first for ``--demo``),
and the run directory. Importing it imports no torch: ``python -m vqa.lxmert.train`` checks its config
before transformers and the model are loaded."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common import attention
from common.utils.config import PROBABILITY, POSITIVE, Rule, at_least, layer_configs, packaged_config, place_demo

__all__ = ["CONFIG_NAME", "OPTIMIZERS", "RULES", "default_out_dir", "load_config"]

CONFIG_NAME = "lxmert.yaml"
OPTIMIZERS = ("lamb_lookahead", "adamw")  # optim.name (vqa.lxmert.optim)
#: Ranges and choices of the LXMERT keys (beyond :data:`common.utils.config.RULES`).
RULES = {
    "data.max_words": at_least(3),  # [CLS], a word piece, [SEP]
    **{f"model.adaptation.layerdrop.{stack}": at_least(0) for stack in ("language", "vision", "cross")},
    "optim.name": Rule(choices=OPTIMIZERS), "optim.max_lr": POSITIVE, "optim.step_size_up": at_least(1),
    "optim.warmup": PROBABILITY, "optim.lookahead_k": at_least(1), "optim.lookahead_alpha": Rule(0, 1, low_open=True),
    "optim.adaptive_lr_mult": POSITIVE, "train.checkpoint_every": at_least(1),
}


def load_config(variant: Optional[str] = None, overrides: Sequence[str] = (),
                config_file: Optional[str] = None, demo: bool = False) -> DictConfig:
    """``vqa/configs/lxmert.yaml`` with ``variants.<variant>`` merged over ``model.adaptation``,
    then the ``--config`` file, then ``key=value`` overrides. ``demo``: ``vqa/configs/lxmert_demo.yaml``
    first, the run in ``out_dir`` (default ``runs/lxmert/demo/<variant>``) and its synthetic data in
    ``<out_dir>/data``."""
    base = packaged_config("vqa", CONFIG_NAME)
    if demo:
        base = OmegaConf.merge(base, packaged_config("vqa", "lxmert_demo.yaml"))
    name = variant or base.variant
    if name not in base.variants:
        raise ValueError(f"unknown variant {name!r}; vqa/configs/{CONFIG_NAME} defines {sorted(base.variants)}")
    base.variant = name
    base.model.adaptation = OmegaConf.merge(base.model.adaptation, base.variants[name])
    cfg = layer_configs(base, config_file, overrides, defaults_name=f"vqa/configs/{CONFIG_NAME}",
                        open_keys=("data.splits", "model.adaptation", "model.random_init"),
                        rules={**RULES, "model.adaptation.normalizer": Rule(choices=attention.available())})
    if demo:
        if cfg.model.random_init is None:
            raise ValueError("model.random_init=null: --demo has no pretrained weights; keep the demo's "
                             "random_init (vqa/configs/lxmert_demo.yaml)")
        place_demo(cfg, Path("runs") / "lxmert" / "demo" / cfg.variant)
    return cfg


def default_out_dir(cfg: DictConfig) -> Path:
    """``out_dir``, else ``runs/lxmert/<variant>``."""
    return Path(cfg.out_dir) if cfg.out_dir else Path("runs") / "lxmert" / cfg.variant


#: keys that may change when a run is resumed (where files go, speed and logging knobs)
RESUMABLE_KEYS = ("data_root", "out_dir", "device", "model.pretrained", "train.max_steps", "train.num_workers",
                  "train.num_threads", "train.eval_batch_size", "train.log_every", "train.checkpoint_every",
                  "train.precision", "train.compile")
