"""BLEU with ``sacrebleu``, two ways.

* ``tokenised``: BPE removed, on Moses-tokenised lowercased text with no further
  tokenisation (``tokenize="none"``): the number ``multi-bleu.perl`` gives and the papers
  report (fairseq's ``--remove-bpe`` + ``multi-bleu``; var-attn's ``sed 's/@@ //g' | multi-bleu``).
* ``detokenised``: the hypotheses Moses-detokenised and scored against untokenised
  references by SacreBLEU's default ``13a`` tokeniser, lowercased (the models are trained on
  lowercased text), with SacreBLEU's signature.
"""
from __future__ import annotations

from typing import Dict, Sequence

import sacrebleu

from .bpe import remove_bpe
from .text import MosesDetokenizer


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def tokenised_bleu(hypotheses_bpe: Sequence[str], references_tok: Sequence[str]) -> float:
    """multi-bleu-style BLEU of BPE hypotheses against tokenised lowercased references."""
    _check(hypotheses_bpe, references_tok)
    hyps = [remove_bpe(h) for h in hypotheses_bpe]
    return sacrebleu.corpus_bleu(hyps, [list(references_tok)], tokenize="none", force=True).score


def detokenised_bleu(hypotheses_bpe: Sequence[str], references_raw: Sequence[str], lang: str) -> Dict[str, object]:
    """SacreBLEU (13a, lowercased) of detokenised hypotheses: ``{"score", "signature"}``."""
    _check(hypotheses_bpe, references_raw)
    detok = MosesDetokenizer(lang)
    hyps = [detok(remove_bpe(h)) for h in hypotheses_bpe]
    metric = sacrebleu.metrics.BLEU(lowercase=True)
    score = metric.corpus_score(hyps, [list(references_raw)])
    return {"score": score.score, "signature": str(metric.get_signature())}
