"""The seed loop of a multi-seed run: each seed trained once (an earlier run's finished seeds are reused), its
record written atomically as ``<out_dir>/seed<k>.json``, and the mean +- std over seeds of every metric."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Union

from common.utils import console
from common.utils.distributed import broadcast_objects
from common.utils.io import atomic_write_json
from common.utils.results import results_record
from common.utils.runs import finished_seed, mean_std, open_run_dir
from common.utils.runtime import Runtime

from .engine import Engine, Plan, Task


def train_seeds(out_dir: Path, config: Dict, resumable: Iterable[str], seeds: Iterable[int], runtime: Runtime,
                task: Callable[[int, Path], Task], plan: Union[Plan, Callable[[Task], Plan]],
                describe: Callable[[dict], str], progress: bool = True, desc: str = "seeds") -> List[dict]:
    """Each seed's record, in order: read from ``seed<k>.json`` when an earlier run finished the seed, else
    trained: ``task(seed, run_dir)`` under ``<out_dir>/seed<k>`` by an :class:`Engine` to the end of ``plan`` (or of
    ``plan(task)``, a budget the task computes), and its ``task.record(state)`` written to ``seed<k>.json`` by the
    main process. ``out_dir`` gets ``config.json``; one holding another config (beyond the ``resumable`` keys) is
    refused with the keys named. ``describe(record)`` is the seed's line in the log (``test accuracy 83.10``)."""
    env = runtime.env
    if env.is_main:
        open_run_dir(out_dir, config, resumable)
    per_seed, seeds = [], list(seeds)
    bar = console.progress(seeds, desc=desc, enabled=progress and env.is_main, unit="seed", smooth_eta=True) \
        if len(seeds) > 1 else seeds  # one seed: its own bar says it all
    for seed in bar:
        record = broadcast_objects([finished_seed(out_dir, seed)], env)[0]
        if record is not None:
            if bar is not seeds:
                bar.skip()  # reused: no part of the ETA of the seeds left
            done = "done before"
        else:
            run_dir = Path(out_dir) / f"seed{seed}"
            seed_task = task(seed, run_dir)
            seed_plan = plan if isinstance(plan, Plan) else plan(seed_task)
            engine = Engine(runtime, run_dir, seed_plan, desc=f"seed {seed} update", progress=progress)
            record = seed_task.record(engine.fit(seed_task))
            if env.is_main:
                atomic_write_json(Path(out_dir) / f"seed{seed}.json", record)
            done = "done"
        if env.is_main:
            console.say(f"seed {seed}: {done} ({describe(record)})")
        per_seed.append(record)
    return per_seed


def seeds_record(config: Dict, per_seed: List[Mapping], summary: Iterable[str] = (), **fields) -> Dict:
    """``results.json`` of a multi-seed run (:func:`~common.utils.results_record`): ``fields``; the ``seeds`` (each
    record's ``seed``); the mean +- std over the seeds of each ``summary`` key of their records (of each metric, where
    the key holds a dict of metrics: ``dev``, ``test``; a key the records lack is left out); ``train_seconds``
    (``{"per_seed": [...], "total": ...}``, each kept from the run that trained the seed); and ``per_seed``."""
    seconds = [record["train_seconds"] for record in per_seed]
    means = {key: {metric: mean_std([record[key][metric] for record in per_seed]) for metric in per_seed[0][key]}
             if isinstance(per_seed[0][key], Mapping) else mean_std([record[key] for record in per_seed])
             for key in summary if key in per_seed[0]}
    return results_record(config, **fields, seeds=[record["seed"] for record in per_seed], **means,
                          train_seconds={"per_seed": seconds, "total": sum(seconds)}, per_seed=per_seed)


def seed_run_files(out_dir: Path, seeds: Iterable[int]) -> List[Path]:
    """What :func:`train_seeds` and the engine write under ``out_dir``: ``config.json``, then each seed's record
    ``seed<k>.json`` and run directory ``seed<k>/``."""
    return [Path(out_dir) / "config.json",
            *(Path(out_dir) / name for seed in seeds for name in (f"seed{seed}.json", f"seed{seed}"))]
