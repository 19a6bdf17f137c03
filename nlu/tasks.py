"""The six small GLUE tasks: where their TSV columns are, their labels and their official metrics.

Column layouts are those of the files ``download_glue_data.py`` writes (``glue_data/<TASK>/``);
test files have no labels and often an extra ``index`` column, so each split has its own layout.
Task names are accepted case-insensitively, with or without ``-``/``_`` (``sts-b``, ``stsb``, ``SST2``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Layout:
    """The columns of one split's TSV file (0-based indices)."""
    header: bool
    columns: int
    text_a: int
    text_b: Optional[int] = None
    label: Optional[int] = None


@dataclass(frozen=True)
class TaskSpec:
    """One GLUE task. ``labels`` lists the label strings in id order (empty for regression)."""
    name: str
    directory: str
    labelled: Layout  # train and dev
    test: Layout
    labels: Tuple[str, ...] = ()
    regression: bool = False
    metrics: Tuple[str, ...] = ("accuracy",)
    main_metric: str = "accuracy"

    @property
    def num_labels(self) -> int:
        """Output size of a classifier head (1 for regression)."""
        return 1 if self.regression else len(self.labels)

    @property
    def pair(self) -> bool:
        """Whether examples are sentence pairs (``text_b`` present)."""
        return self.labelled.text_b is not None

    def layout(self, split: str) -> Layout:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        return self.test if split == "test" else self.labelled


_BINARY = ("0", "1")
TASKS: Dict[str, TaskSpec] = {spec.name: spec for spec in (
    # CoLA train/dev: source, label, original label mark, sentence (no header); test: index, sentence.
    TaskSpec("CoLA", "CoLA", Layout(False, 4, 3, label=1), Layout(True, 2, 1), _BINARY,
             metrics=("mcc",), main_metric="mcc"),
    # MRPC train/dev: Quality, #1 ID, #2 ID, #1 String, #2 String (BOM before Quality); test: index instead of Quality.
    TaskSpec("MRPC", "MRPC", Layout(True, 5, 3, 4, label=0), Layout(True, 5, 3, 4), _BINARY,
             metrics=("accuracy", "f1"), main_metric="accuracy"),
    TaskSpec("RTE", "RTE", Layout(True, 4, 1, 2, label=3), Layout(True, 3, 1, 2), ("entailment", "not_entailment")),
    # STS-B: index genre filename year old_index source1 source2 sentence1 sentence2 score (test: no score).
    TaskSpec("STS-B", "STS-B", Layout(True, 10, 7, 8, label=9), Layout(True, 9, 7, 8), regression=True,
             metrics=("pearson", "spearman"), main_metric="pearson"),
    # SST-2 train/dev: sentence, label; test: index, sentence.
    TaskSpec("SST-2", "SST-2", Layout(True, 2, 0, label=1), Layout(True, 2, 1), _BINARY),
    TaskSpec("WNLI", "WNLI", Layout(True, 4, 1, 2, label=3), Layout(True, 3, 1, 2), _BINARY),
)}

#: STS-B similarity scores lie in this closed range.
SCORE_RANGE = (0.0, 5.0)


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


_BY_KEY = {_key(name): spec for name, spec in TASKS.items()}


def get_task(task) -> TaskSpec:
    """The :class:`TaskSpec` of ``task`` (a name in any case, with or without ``-``, or a spec itself)."""
    if isinstance(task, TaskSpec):
        return task
    spec = _BY_KEY.get(_key(str(task)))
    if spec is None:
        raise ValueError(f"unknown GLUE task {task!r}; use one of {', '.join(TASKS)} (case-insensitive)")
    return spec
