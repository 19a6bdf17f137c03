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
    """``argmax`` decoding: ``LongTensor[B, T]``, ``T <= max_len``; rows end at ``eos`` then ``pad``."""
    _check(batch_size, max_len, state)
    pad = eos if pad is None else pad
    tokens = torch.full((batch_size,), bos, dtype=torch.long, device=_device(state, device))
    finished = torch.zeros(batch_size, dtype=torch.bool, device=tokens.device)
    out = []
    for _ in range(max_len):
        log_probs, state = step(tokens, state)
        tokens = log_probs.argmax(-1).masked_fill(finished, pad)
        out.append(tokens)
        finished |= tokens == eos
        if bool(finished.all()):
            break
    return torch.stack(out, 1)


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
    B, K = batch_size, beam_size
    dev = _device(state, device)
    state = map_state(lambda t: t.repeat_interleave(K, 0), state)
    rows = torch.arange(B, device=dev)
    live_scores = torch.full((B, K), float("-inf"), device=dev)
    live_scores[:, 0] = 0.0  # all beams start identical: keep one
    history = torch.full((B, K, max_len), pad, dtype=torch.long, device=dev)
    tokens = torch.full((B * K,), bos, dtype=torch.long, device=dev)
    done_scores = torch.full((B, K), float("-inf"), device=dev)
    done_tokens = torch.full((B, K, max_len), pad, dtype=torch.long, device=dev)
    done_count = torch.zeros(B, dtype=torch.long, device=dev)

    for t in range(max_len):
        log_probs, state = step(tokens, state)
        V = log_probs.shape[-1]
        if V < 2:
            raise ValueError(f"beam search needs a vocabulary of at least 2 tokens, got {V}")
        candidates = (live_scores.unsqueeze(-1) + log_probs.view(B, K, V).float()).view(B, K * V)
        cand_scores, cand_index = candidates.topk(2 * K, dim=1)  # [B, 2K]
        origin, token = cand_index // V, cand_index % V
        cand_history = history.gather(1, origin.unsqueeze(-1).expand(B, 2 * K, max_len)).clone()
        cand_history[:, :, t] = token

        # finish: eos among the best K candidates of sentences still searching
        is_eos = token == eos
        finishing = (is_eos & (torch.arange(2 * K, device=dev) < K) & (done_count < K).unsqueeze(1)
                     & torch.isfinite(cand_scores))
        normalised = cand_scores / float(t + 1) ** length_penalty
        pool_scores = torch.cat([done_scores, normalised.masked_fill(~finishing, float("-inf"))], 1)
        pool_tokens = torch.cat([done_tokens, cand_history], 1)
        done_scores, keep = pool_scores.topk(K, dim=1)
        done_tokens = pool_tokens.gather(1, keep.unsqueeze(-1).expand(B, K, max_len))
        done_count = done_count + finishing.sum(1)
        if bool((done_count >= K).all()):
            break

        # continue: the best K candidates that are not eos (at most K of the 2K are eos)
        live_scores, keep = cand_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)
        origin = origin.gather(1, keep)
        history = cand_history.gather(1, keep.unsqueeze(-1).expand(B, K, max_len))
        tokens = token.gather(1, keep).view(-1)
        state = map_state(lambda s: s.index_select(0, (rows.unsqueeze(1) * K + origin).view(-1)), state)
    else:
        # max_len reached: open hypotheses compete as they are
        open_scores = live_scores / float(max_len) ** length_penalty
        open_scores = open_scores.masked_fill((done_count >= K).unsqueeze(1), float("-inf"))
        pool_scores = torch.cat([done_scores, open_scores], 1)
        pool_tokens = torch.cat([done_tokens, history], 1)
        done_scores, keep = pool_scores.topk(K, dim=1)
        done_tokens = pool_tokens.gather(1, keep.unsqueeze(-1).expand(B, K, max_len))

    best = done_tokens[:, 0]
    lengths = _lengths(best, eos, max_len)
    return best[:, : int(lengths.max())], done_scores[:, 0]


def _lengths(tokens: Tensor, eos: int, max_len: int) -> Tensor:
    """Tokens up to and including the first ``eos`` of each row (``max_len`` when none)."""
    is_eos = tokens == eos
    return torch.where(is_eos.any(1), is_eos.long().argmax(1) + 1, max_len)
