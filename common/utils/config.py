"""YAML configs shipped inside packages, layered with a user file and ``key=value`` overrides.

Every domain keeps its defaults in ``<package>/configs/*.yaml``; a run resolves

    packaged defaults -> optional user YAML (``--config``) -> command-line ``key=value``

with omegaconf. The packaged config is put in struct mode first, so a misspelt key in a
user file or on the command line is an error that names the key, not a silent no-op.
"""
from __future__ import annotations

from importlib import resources
from typing import Any, Dict, Iterable, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def packaged_config(package: str, name: str) -> DictConfig:
    """``<package>/configs/<name>`` as a config (e.g. ``packaged_config("graphattn", "gat.yaml")``)."""
    path = resources.files(f"{package}.configs").joinpath(name)
    if not path.is_file():
        available = sorted(p.name for p in resources.files(f"{package}.configs").iterdir() if p.name.endswith(".yaml"))
        raise FileNotFoundError(f"{package}/configs/{name} does not exist; available: {', '.join(available)}")
    return OmegaConf.create(path.read_text(encoding="utf-8"))


def parse_overrides(overrides: Sequence[str]) -> DictConfig:
    """``["optim.lr=0.01", "model.heads=4"]`` as a config; a clear error for anything else."""
    malformed = [item for item in overrides if "=" not in item or item.startswith("=")]
    if malformed:
        raise ValueError(f"bad override {malformed}: use key=value, e.g. optim.lr=0.01")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ValueError(f"bad override in {list(overrides)}: use key=value, e.g. optim.lr=0.01 ({err})") from err


def layer_configs(
    base: DictConfig,
    config_file: Optional[str] = None,
    overrides: Sequence[str] = (),
    open_keys: Iterable[str] = (),
    defaults_name: str = "the packaged config",
) -> DictConfig:
    """Merge a user YAML and then ``key=value`` overrides over ``base``.

    ``open_keys`` are dotted paths (e.g. ``attention.options``) under which new keys are
    allowed; everywhere else an unknown key raises, naming ``defaults_name`` for the list
    of known keys.
    """
    cfg = base.copy()
    OmegaConf.set_struct(cfg, True)
    for key in open_keys:
        node = OmegaConf.select(cfg, key)
        if node is not None:
            OmegaConf.set_struct(node, False)
    layers = []
    if config_file:
        layers.append((f"--config {config_file}", OmegaConf.load(config_file)))
    layers.append(("command line", parse_overrides(overrides)))
    for source, layer in layers:
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as err:
            raise ValueError(f"{source}: {getattr(err, 'msg', err)}. Known keys are those of {defaults_name}") from err
    return cfg


def to_dict(cfg: DictConfig) -> Dict[str, Any]:
    """A plain, JSON-ready dict of ``cfg``."""
    return OmegaConf.to_container(cfg, resolve=True)


def _flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(node, dict) and node:
        flat: Dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}


def config_changes(saved: Dict[str, Any], config: Dict[str, Any], resumable: Iterable[str] = ()) -> Dict[str, tuple]:
    """``{dotted key: (saved value, new value)}`` for every key that differs, except the
    ``resumable`` keys and everything under them (paths, threads, epochs ...)."""
    resumable = tuple(resumable)
    old, new = _flatten(saved), _flatten(config)
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key) and not any(key == r or key.startswith(r + ".") for r in resumable)}


def check_resumable(saved: Dict[str, Any], config: Dict[str, Any], resumable: Iterable[str], run_dir: Any) -> None:
    """Refuse to resume the run in ``run_dir`` (started with ``saved``) under a different config."""
    resumable = tuple(resumable)
    changes = config_changes(saved, config, resumable)
    if changes:
        listed = "; ".join(f"{key}: {a!r} -> {b!r}" for key, (a, b) in changes.items())
        raise ValueError(f"{run_dir} holds a run with a different config ({listed}); choose another output "
                         f"directory (--out) or delete it to start over (only {', '.join(resumable)} may change on resumption)")
