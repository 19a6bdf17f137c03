"""The paper's accuracies (Sec. 2.6): over all words, over out-of-vocabulary words and over ambiguous words, each
group in two definitions:

* ``oov``: the form never occurs in the training data; ``ambiguous``: the form has more than one tag there
  (the definitions the paper's text gives);
* ``oov_index`` and ``ambiguous_index``: the authors' code (``pdufter/convatt``, ``evaluation/postagging.py``):
  OOV is a word outside the word index (``<unk>``: rare training words too, half of the word types being
  indexed), and ambiguous counts only the words inside the index with more than one training tag.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from torch import Tensor

from .data import UNK, Batch

GROUPS = ("all", "oov", "ambiguous", "oov_index", "ambiguous_index")
#: What each group counts, for tables and plots.
GROUP_LABELS = {"all": "all words", "oov": "OOV (unseen in training)", "ambiguous": "ambiguous (training tags)",
                "oov_index": "OOV (outside the word index; the authors')",
                "ambiguous_index": "ambiguous inside the word index (the authors')"}


def accuracies(predictions: Iterable[Tuple[Batch, Tensor]]) -> Dict[str, float]:
    """``{group: %}`` for every group of :data:`GROUPS` and ``{"words": n, "<group>_words": n}`` over
    ``(batch, predicted tags [B, L])`` pairs; a group without words has accuracy NaN."""
    correct = dict.fromkeys(GROUPS, 0)
    total = dict.fromkeys(GROUPS, 0)
    for batch, predicted in predictions:
        right = (predicted == batch.tags) & batch.mask
        unknown = (batch.words == UNK) & batch.mask
        members = {"all": batch.mask, "oov": batch.oov & batch.mask, "ambiguous": batch.ambiguous & batch.mask,
                   "oov_index": unknown, "ambiguous_index": batch.ambiguous & batch.mask & ~unknown}
        for group, chosen in members.items():
            correct[group] += int(right[chosen].sum())
            total[group] += int(chosen.sum())
    out = {group: 100.0 * correct[group] / total[group] if total[group] else float("nan") for group in GROUPS}
    out.update(words=total["all"], **{f"{group}_words": total[group] for group in GROUPS[1:]})
    return out


def updates_to_reach(curve: List[dict], fraction: float = 0.99) -> Optional[int]:
    """The first update whose dev accuracy is at least ``fraction`` of the best on ``curve``."""
    best = max(point["dev_acc"] for point in curve)
    return next((point["step"] for point in curve if point["dev_acc"] >= fraction * best), None)
