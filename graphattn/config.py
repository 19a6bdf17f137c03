"""Configs: YAML files shipped in ``graphattn/configs``, merged with omegaconf.

Resolution order (later wins): ``gat.yaml`` -> ``<dataset>.yaml`` -> that file's
``variants.<attention>`` block (the tuned options and KL schedule of the chosen variant) ->
an optional user YAML (``--config``) -> command-line ``key=value`` overrides.
"""
from __future__ import annotations

from importlib import resources
from typing import Any, Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from .data import canonical_name


def _packaged(name: str) -> DictConfig:
    return OmegaConf.create(resources.files("graphattn.configs").joinpath(name).read_text())


def load_config(
    dataset: Optional[str] = None,
    attention: Optional[str] = None,
    overrides: Sequence[str] = (),
    config_file: Optional[str] = None,
) -> DictConfig:
    """The resolved config for ``dataset`` and ``attention`` (both may also come from
    ``overrides`` such as ``["attention.name=bam-wc", "optim.lr=0.01"]``)."""
    try:
        cli = OmegaConf.from_dotlist(list(overrides))
    except Exception as err:  # omegaconf raises its own grammar errors
        raise ValueError(f"bad override in {list(overrides)}: use key=value, e.g. optim.lr=0.01 ({err})") from err
    user = OmegaConf.load(config_file) if config_file else OmegaConf.create()
    if dataset is not None:
        cli.dataset = dataset
    if attention is not None:
        OmegaConf.update(cli, "attention.name", attention)
    base = _packaged("gat.yaml")
    name = canonical_name(OmegaConf.select(cli, "dataset") or OmegaConf.select(user, "dataset") or base.dataset)
    cfg = OmegaConf.merge(base, _packaged(f"{name.lower()}.yaml"))
    variant_name = OmegaConf.select(cli, "attention.name") or OmegaConf.select(user, "attention.name") \
        or cfg.attention.name
    variants = cfg.pop("variants", OmegaConf.create())
    variant = variants.get(variant_name, OmegaConf.create())
    cfg = OmegaConf.merge(cfg, {"attention": {"name": variant_name, "options": variant.get("options", {})},
                                "kl": variant.get("kl", {})})
    # Struct mode: a misspelt key is an error, except among the normalizer's free-form options.
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_struct(cfg.attention.options, False)
    for source, layer in (("--config " + str(config_file), user), ("command line", cli)):
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except Exception as err:
            raise ValueError(f"{source}: {err.msg if hasattr(err, 'msg') else err}. Known keys are those "
                             f"of graphattn/configs/gat.yaml") from err
    cfg.dataset = name
    return cfg


def to_dict(cfg: DictConfig) -> Dict[str, Any]:
    """A plain, JSON-ready dict of ``cfg``."""
    return OmegaConf.to_container(cfg, resolve=True)
