"""Configs: ``nlu/configs/glue.yaml`` <- ``<preset>.yaml`` (``--preset``) <- ``--config`` file <- ``key=value``."""
from __future__ import annotations

from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import Rule, at_least, layer_configs, packaged_config

from .tasks import get_task

#: The packaged presets (``nlu/configs/<name>.yaml``), listed here so that the command line is checked without IO.
PRESETS = ("official",)

RULES = {"data.max_length": at_least(8), "optim.lr": Rule(low=0, low_open=True), "optim.weight_decay": at_least(0),
         "optim.warmup_ratio": Rule(low=0, high=1), "optim.max_grad_norm": Rule(low=0, low_open=True),
         "train.epochs": at_least(1), "train.batch_size": at_least(1), "train.eval_batch_size": at_least(1),
         "train.checkpoint_every": at_least(1), "train.mc_samples": at_least(0),
         "train.precision": Rule(choices=("fp32", "bf16", "fp16")), "seeds": at_least(1)}


def load_config(overrides: Sequence[str] = (), config_file: Optional[str] = None, preset: Optional[str] = None
                ) -> DictConfig:
    """The resolved, checked config; the task name is normalised (``sts-b`` -> ``STS-B``)."""
    base = packaged_config("nlu", "glue.yaml")
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"--preset {preset}: unknown; available: {', '.join(PRESETS)}")
        base = OmegaConf.merge(base, packaged_config("nlu", f"{preset}.yaml"))
        base.preset = preset
    cfg = layer_configs(base, config_file, overrides, open_keys=["attention.options"],
                        defaults_name="nlu/configs/glue.yaml", rules=RULES)
    cfg.task = get_task(cfg.task).name
    return cfg
