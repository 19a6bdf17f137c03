"""Configs: ``mt/configs/defaults.yaml`` <- ``<preset>.yaml`` <- ``--config`` file <- ``key=value``.

Model options (``model.*``, including the attention mappings) are free-form here and checked
by the model class, which names the bad key.
"""
from __future__ import annotations

from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import layer_configs, packaged_config, to_dict

__all__ = ["load_config", "to_dict"]


def load_config(preset: str, overrides: Sequence[str] = (), config_file: Optional[str] = None) -> DictConfig:
    """The resolved config of ``preset`` (``lstm``, ``lstm-cpu``, ``transformer-lite`` ...)."""
    base = OmegaConf.merge(packaged_config("mt", "defaults.yaml"), packaged_config("mt", f"{preset}.yaml"))
    base.preset = preset
    return layer_configs(base, config_file, overrides, open_keys=["model"],
                         defaults_name=f"mt/configs/defaults.yaml and {preset}.yaml")
