"""Batched translation of id tensors with ``common.decoding`` (greedy or beam search), the BLEU of a
translated split (validation in :mod:`mt.training`, ``python -m mt.evaluate``) and the translation of
text lines with a run (``python -m mt.translate``)."""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from common.decoding import beam_search, greedy_search
from common.text import Vocabulary
from common.utils import console
from common.utils.runtime import Runtime

from .batching import pad_sequences
from .bleu import detokenised_bleu, tokenised_bleu
from .bpe import remove_bpe
from .data import Prepared, corpus, load_split
from .run import RunFiles, load_model
from .text import MosesDetokenizer, MosesPreprocessor


@torch.no_grad()
def translate_ids(model: nn.Module, sources: Sequence[Tensor], src_pad: int, tgt_vocab: Vocabulary,
                  beam_size: int = 5, length_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  batch_size: int = 64, progress: bool = False) -> List[List[int]]:
    """Output ids (no bos/eos) for every source, in input order.

    Sources are sorted by length and decoded ``batch_size`` at a time, each batch up to
    ``max_len_a * longest source + max_len_b`` tokens; ``beam_size=1`` is greedy search.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: List[List[int]] = [[] for _ in sources]
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for chunk in console.progress(chunks, desc="translating batch", enabled=progress):
        src = pad_sequences([sources[i] for i in chunk], src_pad).to(device)
        state = model.encode(src, src.ne(src_pad))
        max_len = int(max_len_a * src.shape[1] + max_len_b)
        common = dict(batch_size=len(chunk), bos=tgt_vocab.bos, eos=tgt_vocab.eos, max_len=max_len,
                      pad=tgt_vocab.pad)
        if beam_size == 1:
            hyps = greedy_search(model.decode_step, state, **common)
        else:
            hyps, _ = beam_search(model.decode_step, state, beam_size=beam_size, length_penalty=length_penalty,
                                  **common)
        for i, row in zip(chunk, hyps.tolist()):
            outputs[i] = row[: row.index(tgt_vocab.eos)] if tgt_vocab.eos in row else row
    model.train(was_training)
    return outputs


def ids_to_text(ids: Sequence[Sequence[int]], vocab: Vocabulary) -> List[str]:
    return [" ".join(vocab.decode(row)) for row in ids]


def bleu_on_split(model, prepared: Prepared, split: str, beam: int, length_penalty: float, max_len_a: float,
                  max_len_b: int, batch_size: int, limit: Optional[int] = None, detok: bool = True,
                  progress: bool = False, runtime: Optional[Runtime] = None) -> Dict[str, object]:
    """Translate ``split`` (its first ``limit`` sentences) with ``model`` (on its device, under the
    ``runtime``'s precision) and score it; hypotheses included."""
    data = load_split(prepared, split)
    refs_tok = prepared.lines(split, "tok", "tgt")
    sources = data.src[:limit] if limit else data.src
    refs_tok = refs_tok[: len(sources)]
    start = time.perf_counter()
    with runtime.autocast() if runtime is not None else nullcontext():
        ids = translate_ids(model, sources, prepared.src_vocab.pad, prepared.tgt_vocab, beam_size=beam,
                            length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b,
                            batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - start
    hyps = ids_to_text(ids, prepared.tgt_vocab)
    result: Dict[str, object] = {"split": split, "sentences": len(hyps), "bleu": tokenised_bleu(hyps, refs_tok),
                                 "decode_seconds": seconds, "sentences_per_second": len(hyps) / seconds,
                                 "hypotheses": hyps}
    if detok:
        refs_raw = prepared.lines(split, "raw", "tgt")[: len(sources)]
        sacre = detokenised_bleu(hyps, refs_raw, prepared.manifest["tgt"])
        result.update(sacrebleu=sacre["score"], sacrebleu_signature=sacre["signature"])
    return result


def translate_lines(files: RunFiles, lines: Sequence[str], beam: int, length_penalty: float,
                    pretokenised: bool = False, tokenised_output: bool = False, average: Optional[int] = None,
                    batch_size: int = 64, runtime: Optional[Runtime] = None) -> List[str]:
    runtime = runtime or Runtime(torch.device("cpu"))
    cfg = files.config()
    src_vocab, tgt_vocab = files.vocabs()
    model = load_model(files, average_last=average).to(runtime.device)
    bpe = files.bpe()
    pre = None if pretokenised else MosesPreprocessor(_lang(files, "src"), normalize_punctuation=True)
    units = [bpe(pre(line) if pre else line.strip()) for line in lines]
    sources = [torch.tensor(src_vocab.encode(u.split(), add_eos=True), dtype=torch.long) for u in units]
    with runtime.autocast():
        ids = translate_ids(model, sources, src_vocab.pad, tgt_vocab, beam_size=beam, length_penalty=length_penalty,
                            max_len_a=cfg["eval"]["max_len_a"], max_len_b=cfg["eval"]["max_len_b"],
                            batch_size=batch_size)
    out = [remove_bpe(h) for h in ids_to_text(ids, tgt_vocab)]
    if tokenised_output:
        return out
    detok = MosesDetokenizer(_lang(files, "tgt"))
    return [detok(line) for line in out]


def _lang(files: RunFiles, side: str) -> str:
    spec = corpus(files.config()["dataset"])
    return spec.src if side == "src" else spec.tgt
