"""YAML configs shipped inside packages, layered with a user file and ``key=value`` overrides.

Every domain keeps its defaults in ``<package>/configs/*.yaml``; a run resolves

    packaged defaults -> optional user YAML (``--config``) -> command-line ``key=value``

with omegaconf. The packaged config is put in struct mode first, so a misspelt key in a
user file or on the command line is an error that names the key and the known keys closest to it
(by the whole dotted path or by its last part), not a silent no-op::

    command line: unknown key train.lr; did you mean optim.lr? (the keys are those of graphattn/configs/gat.yaml)

Every value a layer sets is checked against the packaged one, which is the schema: a number
where the packaged value is a number (an integer where it is an integer), a boolean for a
boolean, a list for a list, a mapping for a mapping (``null`` packaged values take anything).
Then :data:`RULES` (and a domain's own rules) check ranges and choices of the keys a config
has. Each error is one line naming the key, the bad value and what is expected::

    command line: kl.weight='abc': expected a number (float), got a string
    seeds=0: expected an integer >= 1
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.utils import console


def packaged_config(package: str, name: str) -> DictConfig:
    """``<package>/configs/<name>`` as a config (e.g. ``packaged_config("graphattn", "gat.yaml")``)."""
    path = resources.files(f"{package}.configs").joinpath(name)
    if not path.is_file():
        available = sorted(p.name for p in resources.files(f"{package}.configs").iterdir() if p.name.endswith(".yaml"))
        raise FileNotFoundError(f"{package}/configs/{name} does not exist; available: {', '.join(available)}")
    return OmegaConf.create(path.read_text(encoding="utf-8"))


def packaged_preset(package: str, preset: str, presets: Sequence[str]) -> DictConfig:
    """``<package>/configs/<preset>.yaml``, a preset layered over the package's defaults by ``--preset``; an unknown
    name is a ``ValueError`` listing ``presets``."""
    if preset not in presets:
        raise ValueError(f"--preset {preset}: unknown; available: {', '.join(presets)}")
    return packaged_config(package, f"{preset}.yaml")


def parse_overrides(overrides: Sequence[str]) -> DictConfig:
    """``["optim.lr=0.01", "model.heads=4"]`` as a config; a clear error for anything else."""
    malformed = [item for item in overrides if "=" not in item or item.startswith("=")]
    if malformed:
        raise ValueError(f"bad override {malformed}: use key=value, e.g. optim.lr=0.01")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ValueError(f"bad override in {list(overrides)}: use key=value, e.g. optim.lr=0.01 ({err})") from err


def load_user_config(config_file: str) -> DictConfig:
    """The ``--config`` YAML file; a one-line error when it is missing or is not a YAML mapping."""
    path = Path(config_file).expanduser()
    if not path.is_file():
        raise ValueError(f"--config {config_file}: no such file")
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # yaml's and omegaconf's parse errors
        raise ValueError(f"--config {config_file}: not a valid YAML file ({str(err).splitlines()[0]})") from err
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"--config {config_file}: expected a mapping of config keys, e.g. 'optim: {{lr: 0.01}}'")
    return cfg


@dataclasses.dataclass(frozen=True)
class Rule:
    """Allowed values of one config key: a closed range ``[low, high]`` (``low_open`` /
    ``high_open`` exclude an end) or a set of ``choices`` (for a list: of each item, and the list must hold
    the ``required`` ones). ``null`` passes: whether a key may be null is the type check's call (only keys
    packaged as ``null`` may be)."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    choices: Optional[Sequence[str]] = None
    high_open: bool = False
    required: Sequence[str] = ()

    def problem(self, value: Any) -> Optional[str]:
        """What is wrong with ``value`` (None: nothing)."""
        if value is None:
            return None
        if self.choices is not None:
            listed = ", ".join(map(str, self.choices))
            if isinstance(value, (list, ListConfig)):
                with_required = f" with {', '.join(self.required)}" if self.required else ""
                fits = all(item in self.choices for item in value) and all(item in value for item in self.required)
                return None if fits else f"expected a list of {listed}{with_required}"
            return None if value in self.choices else f"expected one of {listed}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "expected a number"
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high or (isinstance(value, float) and math.isnan(value)):
            bounds = [f"{'>' if self.low_open else '>='} {self.low:g}"] if self.low is not None else []
            bounds += [f"{'<' if self.high_open else '<='} {self.high:g}"] if self.high is not None else []
            return f"expected a number {' and '.join(bounds)}"
        return None


def at_least(low: float) -> Rule:
    return Rule(low=low)


POSITIVE = Rule(low=0, low_open=True)
PROBABILITY = Rule(low=0, high=1)
DROPOUT = Rule(low=0, high=1, high_open=True)  # p = 1 would drop everything

#: Ranges and choices of the keys several domains share; each applies where a config has the key.
RULES: Dict[str, Rule] = {
    "seeds": at_least(1), "first_seed": at_least(0), "seed": at_least(0),
    "optim.lr": POSITIVE, "optim.weight_decay": at_least(0), "optim.label_smoothing": Rule(low=0, high=1),
    "kl.weight": at_least(0), "kl.warmup": at_least(0), "kl.schedule": Rule(choices=("constant", "linear", "sigmoid")),
    "model.dropout": DROPOUT, "model.value_dropout": DROPOUT, "model.heads": at_least(1),
    "optim.eps": POSITIVE, "optim.grad_clip": at_least(0), "optim.decay_rate": POSITIVE, "data.max_regions": at_least(1),
    "train.precision": Rule(choices=("fp32", "bf16", "fp16")), "train.patience": at_least(0),
    "train.compile": Rule(choices=("off", "default", "reduce-overhead", "max-autotune", True, False)),
    "train.max_epochs": at_least(1), "train.max_steps": at_least(1), "train.epochs": at_least(1),
    "train.max_minutes": at_least(0),
    "train.batch_size": at_least(1), "train.eval_batch_size": at_least(1), "train.num_workers": at_least(0),
    "train.num_threads": at_least(1), "train.threads": at_least(1),
    "train.log_every": at_least(1), "train.eval_every": at_least(0),
}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean (true or false)"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number (float)"
    if isinstance(value, (list, ListConfig)):
        return "a list"
    if isinstance(value, (dict, DictConfig)):
        return "a mapping"
    if value is None:
        return "nothing"
    return "a string"


def _fits(schema: Any, value: Any) -> bool:
    """Whether ``value`` may replace the packaged ``schema`` value."""
    if schema is None:
        return True
    if isinstance(schema, bool):
        return isinstance(value, bool)
    if isinstance(schema, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(schema, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(schema, ListConfig):
        return value is None or isinstance(value, (list, ListConfig))
    if isinstance(schema, DictConfig):
        return value is None or isinstance(value, (dict, DictConfig))
    return not isinstance(value, (list, dict, ListConfig, DictConfig))  # a string: any scalar or null


def check_types(cfg: DictConfig, layer: DictConfig, source: str) -> None:
    """Every value ``layer`` sets has the type of the value it replaces in ``cfg`` (see the module
    docstring); keys ``cfg`` lacks are left to the merge (unknown, or under an open key)."""
    for key, value in flatten(OmegaConf.to_container(layer, resolve=False)).items():
        node, parts = cfg, key.split(".")
        for depth, part in enumerate(parts, 1):
            if not isinstance(node, DictConfig) or part not in node:
                break
            node = node[part]
            if depth == len(parts) or not isinstance(node, DictConfig):
                given = value if depth == len(parts) else OmegaConf.select(layer, ".".join(parts[:depth]))
                if isinstance(given, (DictConfig, ListConfig)):
                    given = OmegaConf.to_container(given)
                if not _fits(node, given):
                    example = "" if isinstance(node, (DictConfig, ListConfig)) else f" like {node!r}"
                    raise ValueError(f"{source}: {'.'.join(parts[:depth])}={'' if given is None else repr(given)}: "
                                     f"expected {_kind(node)}"
                                     f"{example}, got {_kind(given)}")
                break


#: How alike (difflib's ratio) a known key must be to a mistyped one to be suggested, and how far below the
#: best suggestion another may be.
SUGGEST_CUTOFF, SUGGEST_MARGIN = 0.6, 0.1


def _dotted_keys(node: Any, prefix: str = "") -> List[str]:
    """Every dotted key of a nested dict, sections included (``optim``, ``optim.lr`` ...)."""
    if not isinstance(node, dict):
        return []
    return [dotted for key, value in node.items()
            for dotted in (f"{prefix}{key}", *_dotted_keys(value, f"{prefix}{key}."))]


def close_keys(key: str, known: Iterable[str], n: int = 3) -> List[str]:
    """The ``known`` dotted keys most like the mistyped ``key``, best first: alike as whole paths or in their
    last parts (``train.lr`` -> ``optim.lr``), at least :data:`SUGGEST_CUTOFF` and within :data:`SUGGEST_MARGIN`
    of the best."""
    last = key.rsplit(".", 1)[-1]

    def likeness(candidate: str) -> float:
        return max(difflib.SequenceMatcher(None, key, candidate).ratio(),
                   difflib.SequenceMatcher(None, last, candidate.rsplit(".", 1)[-1]).ratio())

    scores = {candidate: likeness(candidate) for candidate in known}
    ranked = sorted(scores, key=lambda candidate: (-scores[candidate],
                                                   -difflib.SequenceMatcher(None, key, candidate).ratio(), candidate))
    floor = max(SUGGEST_CUTOFF, scores[ranked[0]] - SUGGEST_MARGIN) if ranked else SUGGEST_CUTOFF
    return [candidate for candidate in ranked if scores[candidate] >= floor][:n]


def unknown_key(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted ``key`` is missing from ``cfg`` where ``cfg`` is closed to new keys (struct mode);
    a key below a value that is not a mapping is :func:`check_types`' concern."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or not OmegaConf.is_struct(node):
            return False
        if part not in node:
            return True
        node = node[part]
    return False


def check_known(cfg: DictConfig, layer: DictConfig, source: str, defaults_name: str) -> None:
    """Every key ``layer`` sets exists in ``cfg`` (or lies under one of its open keys); else one line naming the
    first unknown key and the known keys most like it (:func:`close_keys`)."""
    for key in flatten(OmegaConf.to_container(layer, resolve=False)):
        if key and unknown_key(cfg, key):  # "": an empty layer
            matches = close_keys(key, _dotted_keys(OmegaConf.to_container(cfg, resolve=False)))
            listed = " or ".join(", ".join(matches).rsplit(", ", 1))
            hint = f"did you mean {listed}? (the keys are those of {defaults_name})" if matches \
                else f"the keys are those of {defaults_name}"
            raise ValueError(f"{source}: unknown key {key}; {hint}")


def check_rules(cfg: DictConfig, rules: Mapping[str, Rule] = RULES) -> None:
    """Every key of ``rules`` that ``cfg`` has holds an allowed value."""
    for key, rule in rules.items():
        node = cfg
        for part in key.split("."):
            if not isinstance(node, DictConfig) or part not in node:
                break
            node = node[part]
        else:
            problem = rule.problem(node)
            if problem:
                raise ValueError(f"{key}={node!r}: {problem}")


def layer_configs(
    base: DictConfig,
    config_file: Optional[str] = None,
    overrides: Sequence[str] = (),
    open_keys: Iterable[str] = (),
    defaults_name: str = "the packaged config",
    rules: Optional[Mapping[str, Rule]] = None,
) -> DictConfig:
    """Merge a user YAML and then ``key=value`` overrides over ``base``; check the result.

    ``open_keys`` are dotted paths (e.g. ``attention.options``) under which new keys are
    allowed; everywhere else an unknown key raises, naming ``defaults_name`` for the list
    of known keys. Values are checked against ``base``'s types and against :data:`RULES`
    plus ``rules`` (a domain's own ranges and choices).
    """
    cfg = base.copy()
    OmegaConf.set_struct(cfg, True)
    for key in open_keys:
        node = OmegaConf.select(cfg, key)
        if node is not None:
            OmegaConf.set_struct(node, False)
    layers = []
    if config_file:
        layers.append((f"--config {config_file}", load_user_config(config_file)))
    layers.append(("command line", parse_overrides(overrides)))
    for source, layer in layers:
        check_known(cfg, layer, source, defaults_name)
        check_types(cfg, layer, source)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as err:  # omegaconf's own checks: their first line is the message
            raise ValueError(f"{source}: {str(err).splitlines()[0]}") from err
    from common.attention import available  # the registry of variants, checked before anything is built

    check_rules(cfg, {**RULES, "attention.name": Rule(choices=available()), **(rules or {})})
    return cfg


def place_demo(cfg: DictConfig, default_out_dir: Path) -> None:
    """Put a ``--demo`` run in ``out_dir`` (default ``default_out_dir``) and its synthetic data in
    ``<out_dir>/data``; a data root given too is refused, as the demo would write into it."""
    if cfg.data_root is not None:
        raise ValueError(f"data_root={cfg.data_root}: --demo writes its synthetic data to <out>/data, not to a "
                         f"data root; drop --data-root (or data_root=)")
    cfg.out_dir = cfg.out_dir or str(default_out_dir)
    cfg.data_root = str(Path(cfg.out_dir) / "data")


def to_dict(cfg: DictConfig) -> Dict[str, Any]:
    """A plain, JSON-ready dict of ``cfg``."""
    return OmegaConf.to_container(cfg, resolve=True)


def flatten(node: Any, whole: Iterable[str] = (), prefix: str = "") -> Dict[str, Any]:
    """``{dotted key: value}`` of a nested dict's leaves (an empty dict is a leaf); the dotted keys of ``whole``
    stay one value each (e.g. ``attention.options``, compared as a mapping)."""
    whole = tuple(whole)
    if isinstance(node, dict) and node and prefix[:-1] not in whole:
        flat: Dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, whole, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}


def preset_deviations(cfg: DictConfig, layer: DictConfig, whole: Iterable[str] = (),
                      skip: Sequence[str] = ()) -> Dict[str, dict]:
    """The keys where ``cfg`` differs from what the preset ``layer`` sets, ``{key: {"preset": .., "run": ..}}``
    (``whole``: keys compared as one mapping; ``skip``: key prefixes that do not count)."""
    found = {}
    for key, wanted in flatten(OmegaConf.to_container(layer, resolve=True), whole=whole).items():
        if not key or key.startswith(tuple(skip)):  # "": a preset that sets nothing
            continue
        actual = OmegaConf.select(cfg, key)
        actual = OmegaConf.to_container(actual, resolve=True) if isinstance(actual, DictConfig) else actual
        if actual != wanted:
            found[key] = {"preset": wanted, "run": actual}
    return found


def note_deviations(preset: str, differs: Dict[str, dict], enabled: bool = True) -> None:
    """The one line a run prints when it differs from its preset (:func:`preset_deviations`), if it does; ``preset``
    as the user chose it (``--preset official``, ``preset=official``)."""
    if differs and enabled:
        console.say(f"differs from {preset} in " + ", ".join(
            f"{key}={value['run']} (preset: {value['preset']})" for key, value in differs.items()))


def config_changes(saved: Dict[str, Any], config: Dict[str, Any], resumable: Iterable[str] = ()) -> Dict[str, tuple]:
    """``{dotted key: (saved value, new value)}`` for every key that differs, except the
    ``resumable`` keys and everything under them (paths, threads, epochs ...)."""
    resumable = tuple(resumable)
    old, new = flatten(saved), flatten(config)
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
