"""The files of a training run and loading its model (best weights or an average of checkpoints).

A run directory holds ``config.json`` (the resolved config), ``best.pt`` (the selected
weights), ``checkpoints/step_<N>.pt`` (resumable training state), ``vocab.src.json``,
``vocab.tgt.json`` and ``bpe.codes`` (so that ``mt.translate`` needs nothing else),
``metrics.jsonl`` + TensorBoard events, ``curves.png`` and ``results.json``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from common.text import Vocabulary
from common.utils import Checkpointer, atomic_write_json, average_checkpoints
from common.utils.config import check_resumable

from .bpe import BPE
from .data import DataError, Prepared, ensure_prepared


class RunFiles:
    """Paths inside a run directory, with clear errors when something is missing."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        if not (self.dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.dir / 'config.json'} is missing: {self.dir} is not a run directory "
                                    "written by `python -m mt.train`")

    @classmethod
    def write(cls, run_dir: Path, config: dict, prepared: Prepared, resumable: Iterable[str]) -> "RunFiles":
        """Write ``config.json`` (a run with checkpoints resumes only under the same config, but for the
        ``resumable`` keys), the vocabularies and the BPE codes of a new or resumed run; its files."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "config.json"
        if path.exists() and Checkpointer(run_dir).paths():
            check_resumable(json.loads(path.read_text(encoding="utf-8")), config, resumable, run_dir)
        atomic_write_json(path, config)
        prepared.src_vocab.save(run_dir / "vocab.src.json")
        prepared.tgt_vocab.save(run_dir / "vocab.tgt.json")
        shutil.copyfile(prepared.bpe.codes, run_dir / "bpe.codes")
        return cls(run_dir)

    def config(self) -> dict:
        return json.loads((self.dir / "config.json").read_text(encoding="utf-8"))

    def vocabs(self) -> tuple[Vocabulary, Vocabulary]:
        return Vocabulary.load(self.dir / "vocab.src.json"), Vocabulary.load(self.dir / "vocab.tgt.json")

    def bpe(self) -> BPE:
        return BPE(self.dir / "bpe.codes")

    def prepared(self, data_root: Path) -> Prepared:
        cfg = self.config()
        prepared = ensure_prepared(cfg["dataset"], data_root, cfg["prepared_dir"], cfg["data"]["num_merges"])
        src, tgt = self.vocabs()
        if prepared.src_vocab != src or prepared.tgt_vocab != tgt:
            raise DataError(f"the vocabularies of {prepared.dir} differ from those the run {self.dir} was trained "
                            "with; point prepared_dir at the corpus the run used")
        return prepared

    def checkpoints(self) -> List[Path]:
        return Checkpointer(self.dir).paths()


def new_model(cfg: dict, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> nn.Module:
    from .models import build_model  # the models and their attention layers load only when a model is built

    return build_model(cfg["model"], len(src_vocab), len(tgt_vocab), src_vocab.pad, tgt_vocab.pad)


def weights_of(files: RunFiles, average_last: Optional[int] = None,
               checkpoint: Optional[Path] = None) -> Union[Path, Tuple[Path, ...]]:
    """The file(s) whose weights :func:`load_model` reads: ``checkpoint``, the last ``average_last``
    checkpoints (a tuple) or ``best.pt``; a clear error when they are missing."""
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            raise FileNotFoundError(f"checkpoint {checkpoint} does not exist; the run has {files.checkpoints()}")
        return Path(checkpoint)
    if average_last and average_last > 1:
        paths = files.checkpoints()[-average_last:]
        if len(paths) < average_last:
            raise FileNotFoundError(f"{files.dir}/checkpoints holds {len(paths)} checkpoints, fewer than "
                                    f"--average {average_last}")
        return tuple(paths)
    best = files.dir / "best.pt"
    if not best.is_file():
        raise FileNotFoundError(f"{best} is missing: training has not validated yet (or was not started)")
    return best


def load_model(files: RunFiles, average_last: Optional[int] = None, checkpoint: Optional[Path] = None) -> nn.Module:
    """The run's model in eval mode: ``best.pt``, the mean of the last ``average_last``
    checkpoints, or the weights of one ``checkpoint`` file (:func:`weights_of`)."""
    src, tgt = files.vocabs()
    model = new_model(files.config(), src, tgt)
    weights = weights_of(files, average_last, checkpoint)
    if isinstance(weights, tuple):
        model.load_state_dict(average_checkpoints(list(weights)))
    else:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=False)["model"])
    return model.eval()
