"""Configs: YAML files shipped in ``graphattn/configs``, layered with ``common.utils.config``.

Resolution order (later wins): ``gat.yaml`` -> ``<dataset>.yaml`` -> the preset named by
``preset`` (e.g. ``preset=official``: ``official.yaml``, whose ``variants`` replace the dataset's)
-> the ``variants.<attention>`` block (the tuned options and KL schedule of the chosen variant)
-> an optional user YAML (``--config``) -> command-line ``key=value`` overrides.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from common.utils.config import (Rule, at_least, layer_configs, load_user_config, packaged_config, parse_overrides,
                                 preset_deviations, to_dict)

__all__ = ["DATASETS", "KL_REDUCTIONS", "RULES", "canonical_name", "load_config", "to_dict"]

#: The datasets, by lower-case name: the Planetoid graphs and the synthetic demo graph (graphattn.fixtures).
DATASETS = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed", "demo": "Demo"}
#: How :meth:`graphattn.GAT.kl` combines the layers' KL terms.
KL_REDUCTIONS = ("layer_sum", "head_mean")

#: Ranges and choices of the GAT keys (beyond :data:`common.utils.config.RULES`).
RULES = {"model.hidden_channels": at_least(1), "model.out_heads": at_least(1), "model.negative_slope": at_least(0),
         "kl.reduction": Rule(choices=KL_REDUCTIONS), "loader.kind": Rule(choices=("full", "neighbor")),
         "loader.batch_size": at_least(1), "loader.eval_batch_size": at_least(1), "loader.num_workers": at_least(0)}


def canonical_name(name: str) -> str:
    """``"cora"`` / ``"Cora"`` -> ``"Cora"``; unknown names raise with the choices."""
    try:
        return DATASETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown Planetoid dataset {name!r}; choose one of {sorted(DATASETS.values())}") from None


def preset_file(preset_name: str) -> DictConfig:
    """``graphattn/configs/<preset_name>.yaml``; an unknown name is a ``ValueError`` naming the packaged one."""
    try:
        return packaged_config("graphattn", f"{preset_name}.yaml")
    except FileNotFoundError:
        raise ValueError(f"unknown preset {preset_name!r}; the packaged one is 'official' "
                         f"(graphattn/configs/official.yaml)") from None


def merge_variant(cfg: DictConfig, attention: str) -> DictConfig:
    """``cfg`` without its ``variants`` block, the options and KL schedule of ``variants.<attention>`` merged in
    (``cfg`` as it is when it has no such block)."""
    variant = (cfg.pop("variants", None) or {}).get(attention)
    if variant is None:
        return cfg
    return OmegaConf.merge(cfg, {"attention": {"options": variant.get("options", {})}, "kl": variant.get("kl", {})})


def preset_settings(preset_name: str, attention: str) -> DictConfig:
    """What ``preset=<preset_name>`` sets for ``attention``: its common keys and its ``variants.<attention>`` block
    (as :func:`load_config` applies them)."""
    return merge_variant(preset_file(preset_name), attention)


def deviations(cfg: DictConfig) -> Dict[str, dict]:
    """The keys where ``cfg`` differs from its preset's settings (none without a preset)."""
    if not cfg.preset:
        return {}
    return preset_deviations(cfg, preset_settings(cfg.preset, cfg.attention.name), whole=("attention.options",))


def load_config(
    dataset: Optional[str] = None,
    attention: Optional[str] = None,
    overrides: Sequence[str] = (),
    config_file: Optional[str] = None,
) -> DictConfig:
    """The resolved config for ``dataset`` and ``attention`` (both may also come from
    ``overrides`` such as ``["attention.name=bam-wc", "optim.lr=0.01"]``)."""
    overrides = list(overrides)
    if dataset is not None:
        overrides.append(f"dataset={dataset}")
    if attention is not None:
        overrides.append(f"attention.name={attention}")
    # The dataset and the variant pick which packaged blocks apply, so look them up first.
    cli = parse_overrides(overrides)
    user = load_user_config(config_file) if config_file else OmegaConf.create()
    base = packaged_config("graphattn", "gat.yaml")
    name = canonical_name(OmegaConf.select(cli, "dataset") or OmegaConf.select(user, "dataset") or base.dataset)
    cfg = OmegaConf.merge(base, packaged_config("graphattn", f"{name.lower()}.yaml"))
    preset_name = OmegaConf.select(cli, "preset") or OmegaConf.select(user, "preset") or cfg.preset
    if preset_name:
        preset = preset_file(preset_name)
        variants = preset.pop("variants", None)
        cfg = OmegaConf.merge(cfg, preset)
        if variants is not None:
            cfg.variants = variants
    variant_name = OmegaConf.select(cli, "attention.name") or OmegaConf.select(user, "attention.name") \
        or cfg.attention.name
    cfg = merge_variant(cfg, variant_name)
    cfg.attention.name = variant_name
    # A misspelt key is an error, except among the normalizer's free-form options.
    cfg = layer_configs(cfg, config_file, overrides, open_keys=["attention.options"],
                        defaults_name="graphattn/configs/gat.yaml", rules=RULES)
    cfg.dataset = name
    return cfg


def default_out_dir(cfg: DictConfig) -> Path:
    return Path(cfg.out_dir) if cfg.out_dir else Path("runs") / "gat" / cfg.dataset / cfg.attention.name


#: Config keys a rerun may change (where files go, how many seeds, where and how fast they compute).
RESUMABLE_KEYS = ("data_root", "out_dir", "seeds", "first_seed", "device", "train.num_threads", "train.compile",
                  "loader.num_workers", "loader.eval_batch_size")
