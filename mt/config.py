"""Configs: ``mt/configs/defaults.yaml`` <- ``<preset>.yaml`` <- ``--config`` file <- ``key=value``.

Model options (``model.*``, including the attention mappings) are free-form here and checked
by the model class, which names the bad key.
"""
from __future__ import annotations

from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import Rule, at_least, layer_configs, packaged_config, to_dict

from .data import CORPORA

__all__ = ["RULES", "load_config", "to_dict"]

#: Ranges and choices of the translation keys (beyond :data:`common.utils.config.RULES`).
RULES = {
    "dataset": Rule(choices=tuple(sorted(CORPORA))),
    "schedule.kind": Rule(choices=("inverse_sqrt", "plateau", "constant")),
    "train.select": Rule(choices=("bleu", "loss")), "batching.max_tokens": at_least(1),
    "batching.max_sentences": at_least(1), "batching.update_freq": at_least(1), "data.num_merges": at_least(1),
    "train.keep_checkpoints": at_least(1), "train.average_last": at_least(1), "optim.clip_norm": at_least(0),
    "eval.beam": at_least(1), "eval.batch_sentences": at_least(1), "eval.valid_bleu_sentences": at_least(1),
}


def load_config(preset: str, overrides: Sequence[str] = (), config_file: Optional[str] = None) -> DictConfig:
    """The resolved config of ``preset`` (``lstm``, ``lstm-cpu``, ``transformer-lite`` ...)."""
    base = OmegaConf.merge(packaged_config("mt", "defaults.yaml"), packaged_config("mt", f"{preset}.yaml"))
    base.preset = preset
    return layer_configs(base, config_file, overrides, open_keys=["model"],
                         defaults_name=f"mt/configs/defaults.yaml and {preset}.yaml", rules=RULES)


#: Config keys that may change between a run and its resumption (where files go, stopping, speed, evaluation).
RESUMABLE_KEYS = ("data_root", "prepared_dir", "out_dir", "device", "train.max_steps", "train.max_epochs",
                  "train.max_minutes", "train.patience", "train.threads", "train.precision", "train.compile",
                  "train.log_every", "train.progress", "train.average_last", "eval")
