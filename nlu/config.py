"""Configs: ``nlu/configs/glue.yaml`` <- ``<preset>.yaml`` (``--preset``, its settings for the task included)
<- ``--config`` file <- ``key=value``."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import (Rule, at_least, layer_configs, packaged_config, packaged_preset,
                                 preset_deviations)

from .tasks import get_task

#: The packaged presets (``nlu/configs/<name>.yaml``), listed here so that the command line is checked without IO.
PRESETS = ("standard", "official")
#: Keys that only act on a stochastic (BAM) arm: a preset's softmax arm does not deviate from the preset in them.
BAM_ARM_KEYS = ("attention.name", "attention.options", "attention.noise_dropout", "kl.")

RULES = {"data.max_length": at_least(8), "optim.lr": Rule(low=0, low_open=True), "optim.weight_decay": at_least(0),
         "optim.warmup_ratio": Rule(low=0, high=1), "optim.warmup_updates": at_least(0),
         "optim.max_grad_norm": Rule(low=0, low_open=True), "train.epochs": at_least(1),
         "train.max_updates": at_least(1), "train.batch_size": at_least(1), "train.accumulation": at_least(1),
         "train.eval_batch_size": at_least(1), "train.checkpoint_every": at_least(1), "train.mc_samples": at_least(0),
         "train.precision": Rule(choices=("fp32", "bf16", "fp16")), "attention.dropout": Rule(low=0, high=1),
         "attention.noise_dropout": Rule(low=0, high=1), "seeds": at_least(1)}


def preset_layer(preset: str, task: str) -> DictConfig:
    """What ``--preset preset`` sets for ``task``: its common keys and its ``tasks.<task>`` block."""
    layer = packaged_preset("nlu", preset, PRESETS)
    per_task = layer.pop("tasks", None)
    if per_task is not None:
        if task not in per_task:
            raise ValueError(f"--preset {preset} has no settings for {task} (it has {', '.join(per_task)}); "
                             f"use --preset standard for {task}")
        layer = OmegaConf.merge(layer, per_task[task])
    return layer


def load_config(overrides: Sequence[str] = (), config_file: Optional[str] = None, preset: Optional[str] = None
                ) -> DictConfig:
    """The resolved, checked config; the task name is normalised (``sts-b`` -> ``STS-B``). A preset's settings
    for the task come from the task the command line (or ``--config``) finally names."""
    base = packaged_config("nlu", "glue.yaml")
    check = dict(open_keys=["attention.options"], defaults_name="nlu/configs/glue.yaml", rules=RULES)
    cfg = layer_configs(base, config_file, overrides, **check)
    task = get_task(cfg.task).name
    if preset is not None:
        layer = preset_layer(preset, task)
        preset_attention = layer.get("attention", {}).get("name")
        base = OmegaConf.merge(base, layer)
        base.preset = preset
        cfg = layer_configs(base, config_file, overrides, **check)
        other_family = cfg.attention.name.split("-")[0] != str(preset_attention).split("-")[0]
        if preset_attention and other_family and not _sets_options(overrides, config_file):
            cfg.attention.options = {}  # the preset's BAM options do not apply to softmax (its other arm) or entmax
    cfg.task = task
    return cfg


def deviations(cfg: DictConfig) -> Dict[str, dict]:
    """The keys where ``cfg`` differs from its preset's settings for its task, ``{key: {preset, run}}``; a softmax
    arm does not differ in the keys that only act on BAM (:data:`BAM_ARM_KEYS`)."""
    return preset_deviations(cfg, preset_layer(cfg.preset, cfg.task), whole=("attention.options",),
                             skip=BAM_ARM_KEYS if cfg.attention.name == "softmax" else ())


def named_preset(cfg: DictConfig) -> bool:
    """Whether the run's preset is not the default (``standard``): its name then marks the run's directory."""
    return cfg.preset not in (None, "standard")


def run_label(cfg: DictConfig) -> str:
    """The run's name in the log and the tables: the normalizer, and a named preset in brackets."""
    return cfg.attention.name + (f" ({cfg.preset})" if named_preset(cfg) else "")


def default_out_dir(cfg: DictConfig) -> Path:
    if cfg.out_dir:
        return Path(cfg.out_dir)
    name = cfg.attention.name + (f"-{cfg.preset}" if named_preset(cfg) else "")
    return Path("runs") / "glue" / cfg.task / name


def _sets_options(overrides: Sequence[str], config_file: Optional[str]) -> bool:
    """Whether the command line or the config file sets ``attention.options`` (or a key under it)."""
    if any(item.split("=", 1)[0].startswith("attention.options") for item in overrides):
        return True
    if config_file:
        from common.utils.config import load_user_config

        return OmegaConf.select(load_user_config(config_file), "attention.options") is not None
    return False


#: Keys that may differ when a run resumes (they do not change what is computed).
RESUMABLE_KEYS = ("device", "out_dir", "data_root", "seeds", "train.num_threads", "train.checkpoint_every",
                  "train.eval_batch_size")
