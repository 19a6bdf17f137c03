"""The paper's accuracies (Sec. 2.6): over all words, over out-of-vocabulary words (forms absent from the
training data) and over ambiguous words (forms with more than one tag in the training data)."""
from __future__ import annotations

from typing import Dict, Iterable, Tuple

from torch import Tensor

from .data import Batch

GROUPS = ("all", "oov", "ambiguous")


def accuracies(predictions: Iterable[Tuple[Batch, Tensor]]) -> Dict[str, float]:
    """``{"all": %, "oov": %, "ambiguous": %, "words": n, "oov_words": n, "ambiguous_words": n}`` over
    ``(batch, predicted tags [B, L])`` pairs; a group without words has accuracy NaN."""
    correct = dict.fromkeys(GROUPS, 0)
    total = dict.fromkeys(GROUPS, 0)
    for batch, predicted in predictions:
        right = (predicted == batch.tags) & batch.mask
        for group, members in (("all", batch.mask), ("oov", batch.oov & batch.mask),
                               ("ambiguous", batch.ambiguous & batch.mask)):
            correct[group] += int(right[members].sum())
            total[group] += int(members.sum())
    out = {group: 100.0 * correct[group] / total[group] if total[group] else float("nan") for group in GROUPS}
    out.update(words=total["all"], oov_words=total["oov"], ambiguous_words=total["ambiguous"])
    return out
