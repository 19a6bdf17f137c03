"""Greedy and batched beam search over any autoregressive ``step`` function.

The model is seen only through

    step(tokens: LongTensor[N], state) -> (log_probs FloatTensor[N, V], new_state)

where ``N`` is the batch (greedy) or batch x beam (beam search) and ``state`` is any nest
(tuple / list / dict) of tensors whose dim 0 is ``N``, or ``None``. Both searches return the
generated tokens without ``bos``; ``eos`` is kept and ``pad`` (default ``eos``) fills the
rest of each row.

Beam search keeps ``beam_size`` live hypotheses per sentence and, as fairseq does, looks at
the best ``2 * beam_size`` continuations each step: an ``eos`` among the best ``beam_size``
finishes a hypothesis (scored ``log p(y) / |y|^length_penalty``, ``|y|`` counting ``eos``),
the best ``beam_size`` others stay live. A sentence is done once it holds ``beam_size``
finished hypotheses; live hypotheses still open at ``max_len`` are scored as they are.
Everything is batched over sentences: one ``topk`` per step, no Python loop per sentence.
In both searches a finished sentence leaves the batch (fairseq does the same), so ``step``
sees fewer rows from then on (its state already index-selected to them).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

Step = Callable[[Tensor, Any], "tuple[Tensor, Any]"]


def map_state(fn: Callable[[Tensor], Tensor], state: Any) -> Any:
    """Apply ``fn`` to every tensor of a (tuple / list / dict) nest; ``None`` stays ``None``."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # namedtuple
        return type(state)(*(map_state(fn, s) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_state(fn, v) for k, v in state.items()}
    raise TypeError(f"decoder state must be a nest of tensors (tuple/list/dict) or None, got {type(state).__name__}")


def _first_tensor(state: Any) -> Optional[Tensor]:
    found = []
    map_state(lambda t: found.append(t) or t, state)
    return found[0] if found else None


def _device(state: Any, device) -> torch.device:
    if device is not None:
        return torch.device(device)
    tensor = _first_tensor(state)
    return tensor.device if tensor is not None else torch.device("cpu")


def _check(batch_size: int, max_len: int, state: Any) -> None:
    if batch_size < 1 or max_len < 1:
        raise ValueError(f"batch_size and max_len must be positive, got {batch_size} and {max_len}")
    tensor = _first_tensor(state)
    if tensor is not None and tensor.shape[0] != batch_size:
        raise ValueError(f"decoder state tensors must have dim 0 = batch_size ({batch_size}), "
                         f"got {tuple(tensor.shape)}")


@torch.no_grad()
def greedy_search(step: Step, state: Any, batch_size: int, bos: int, eos: int, max_len: int,
                  pad: Optional[int] = None, device=None) -> Tensor:
    """``argmax`` decoding: ``LongTensor[B, T]``, ``T <= max_len``; rows end at ``eos`` then ``pad``.

    Finished sentences leave the batch: later steps see only the rows still decoding."""
    _check(batch_size, max_len, state)
    pad = eos if pad is None else pad
    dev = _device(state, device)
    tokens = torch.full((batch_size,), bos, dtype=torch.long, device=dev)
    sentence = torch.arange(batch_size, device=dev)
    out = torch.full((batch_size, max_len), pad, dtype=torch.long, device=dev)
    for t in range(max_len):
        log_probs, state = step(tokens, state)
        tokens = log_probs.argmax(-1)
        out[sentence, t] = tokens
        running = tokens != eos
        if not bool(running.any()):
            return out[:, : t + 1]
        if not bool(running.all()):
            active = running.nonzero().squeeze(1)
            sentence, tokens = sentence[active], tokens[active]
            state = map_state(lambda s: s.index_select(0, active), state)
    return out


@torch.no_grad()
def beam_search(step: Step, state: Any, batch_size: int, bos: int, eos: int, max_len: int, beam_size: int = 5,
                length_penalty: float = 1.0, pad: Optional[int] = None,
                device=None) -> "tuple[Tensor, Tensor]":
    """Best hypothesis per sentence, ``(LongTensor[B, T], FloatTensor[B] scores)``.

    ``state`` is given for batch ``B``; it is expanded to ``B * beam_size`` rows
    (``repeat_interleave``) and reordered with ``index_select(0, ...)`` after each step.
    ``scores`` are ``sum log p / |y|^length_penalty``. ``beam_size=1`` equals greedy search.
    """
    _check(batch_size, max_len, state)
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got {beam_size}")
    pad = eos if pad is None else pad
    K = beam_size
    dev = _device(state, device)
    state = map_state(lambda t: t.repeat_interleave(K, 0), state)
    # per active sentence (finished sentences leave the batch, as in fairseq)
    sentence = torch.arange(batch_size, device=dev)
    live_scores = torch.full((batch_size, K), float("-inf"), device=dev)
    live_scores[:, 0] = 0.0  # all beams start identical: keep one
    history = torch.full((batch_size, K, max_len), pad, dtype=torch.long, device=dev)
    tokens = torch.full((batch_size * K,), bos, dtype=torch.long, device=dev)
    done_scores = torch.full((batch_size, K), float("-inf"), device=dev)
    done_tokens = torch.full((batch_size, K, max_len), pad, dtype=torch.long, device=dev)
    done_count = torch.zeros(batch_size, dtype=torch.long, device=dev)
    final_scores = torch.full((batch_size,), float("-inf"), device=dev)
    final_tokens = torch.full((batch_size, max_len), pad, dtype=torch.long, device=dev)

    for t in range(max_len):
        B = live_scores.shape[0]
        log_probs, state = step(tokens, state)
        V = log_probs.shape[-1]
        if V < 2:
            raise ValueError(f"beam search needs a vocabulary of at least 2 tokens, got {V}")
        candidates = (live_scores.unsqueeze(-1) + log_probs.view(B, K, V).float()).view(B, K * V)
        cand_scores, cand_index = candidates.topk(2 * K, dim=1)  # [B, 2K]
        origin, token = cand_index // V, cand_index % V
        cand_history = history.gather(1, origin.unsqueeze(-1).expand(B, 2 * K, max_len)).clone()
        cand_history[:, :, t] = token

        # finish: eos among the best K candidates
        is_eos = token == eos
        finishing = is_eos & (torch.arange(2 * K, device=dev) < K) & torch.isfinite(cand_scores)
        normalised = cand_scores / float(t + 1) ** length_penalty
        pool_scores = torch.cat([done_scores, normalised.masked_fill(~finishing, float("-inf"))], 1)
        pool_tokens = torch.cat([done_tokens, cand_history], 1)
        done_scores, keep = pool_scores.topk(K, dim=1)
        done_tokens = pool_tokens.gather(1, keep.unsqueeze(-1).expand(B, K, max_len))
        done_count = done_count + finishing.sum(1)
        finished = done_count >= K
        final_scores[sentence[finished]] = done_scores[finished, 0]
        final_tokens[sentence[finished]] = done_tokens[finished, 0]
        if bool(finished.all()):
            break

        # continue: the best K candidates that are not eos (at most K of the 2K are eos)
        live_scores, keep = cand_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)
        origin = origin.gather(1, keep)
        history = cand_history.gather(1, keep.unsqueeze(-1).expand(B, K, max_len))
        tokens = token.gather(1, keep)
        rows = torch.arange(B, device=dev).unsqueeze(1) * K + origin  # [B, K] state rows to continue
        if bool(finished.any()):  # drop finished sentences from the batch
            active = (~finished).nonzero().squeeze(1)
            sentence, live_scores, history, tokens, rows = (x[active] for x in
                                                             (sentence, live_scores, history, tokens, rows))
            done_scores, done_tokens, done_count = done_scores[active], done_tokens[active], done_count[active]
        tokens = tokens.reshape(-1)
        state = map_state(lambda s: s.index_select(0, rows.reshape(-1)), state)
    else:
        # max_len reached: the open hypotheses of unfinished sentences compete as they are
        pool_scores = torch.cat([done_scores, live_scores / float(max_len) ** length_penalty], 1)
        pool_tokens = torch.cat([done_tokens, history], 1)
        best_score, best = pool_scores.max(1)
        final_scores[sentence] = best_score
        final_tokens[sentence] = pool_tokens[torch.arange(len(sentence), device=dev), best]

    lengths = _lengths(final_tokens, eos, max_len)
    return final_tokens[:, : int(lengths.max())], final_scores


def _lengths(tokens: Tensor, eos: int, max_len: int) -> Tensor:
    """Tokens up to and including the first ``eos`` of each row (``max_len`` when none)."""
    is_eos = tokens == eos
    return torch.where(is_eos.any(1), is_eos.long().argmax(1) + 1, max_len)
