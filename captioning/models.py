"""Att2in (Rennie et al., 2017) on region features: self-critical.pytorch's ``att2in2``.

Per step ``t`` with previous word ``w_{t-1}`` and LSTM state ``(h, c)``:

* regions ``v_j = ReLU(W_v f_j)`` (dropout), word ``x_t = ReLU(E w_{t-1})`` (dropout);
* attention ``a_t = normalizer(u^T tanh(W_m v_j + W_h h_{t-1}))`` over the regions and
  context ``z_t = sum_j a_tj v_j`` (:class:`common.attention.AdditiveAttention`; BAM's
  contextual prior sees the projected regions ``W_m v_j``);
* gates ``[i, f, o] = sigmoid(W_x x_t + W_h h_{t-1})[:3]``; the context enters the cell input
  only: ``g = maxout((W_x x_t + W_h h_{t-1})[3:] + W_z z_t)`` over its two halves;
* ``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)``, ``log p(w_t) = log_softmax(W_o dropout(h_t))``.

``<pad>`` and ``<bos>`` get probability exactly zero, so decoding never emits them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn

from common.attention import AdditiveAttention
from common.decoding import beam_search, greedy_search


@dataclass
class Att2inConfig:
    """Sizes of self-critical's ``configs/a2i2.yml`` (``input_encoding_size``, ``rnn_size``,
    ``att_hid_size``, ``drop_prob_lm``)."""

    vocab_size: int
    feature_dim: int = 2048
    embed_dim: int = 512
    rnn_size: int = 512
    att_hidden: int = 512
    dropout: float = 0.5
    attention: str = "softmax"
    attention_options: dict = field(default_factory=dict)


class Att2inCore(nn.Module):
    """One LSTM step whose cell input receives the attended context (``Att2in2Core``)."""

    def __init__(self, cfg: Att2inConfig):
        super().__init__()
        self.rnn_size = cfg.rnn_size
        self.input_gates = nn.Linear(cfg.embed_dim, 5 * cfg.rnn_size)
        self.hidden_gates = nn.Linear(cfg.rnn_size, 5 * cfg.rnn_size)
        self.context_to_cell = nn.Linear(cfg.rnn_size, 2 * cfg.rnn_size)
        self.attention = AdditiveAttention(cfg.rnn_size, cfg.rnn_size, cfg.att_hidden, normalizer=cfg.attention,
                                           normalizer_options=dict(cfg.attention_options))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, word: Tensor, h: Tensor, c: Tensor, regions: Tensor, projected: Tensor,
                mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(output, h, c, attention weights)`` for one step of a batch ``[N, ...]``."""
        context, weights = self.attention(h, regions, mask=mask, projected_memory=projected)
        sums = self.input_gates(word) + self.hidden_gates(h)
        n = self.rnn_size
        in_gate, forget_gate, out_gate = torch.sigmoid(sums[:, : 3 * n]).chunk(3, dim=1)
        cell_input = sums[:, 3 * n:] + self.context_to_cell(context)
        cell_input = torch.maximum(cell_input[:, :n], cell_input[:, n:])
        c = forget_gate * c + in_gate * cell_input
        h = out_gate * torch.tanh(c)
        return self.dropout(h), h, c, weights


class Att2in(nn.Module):
    """Att2in captioner over a variable number of regions per image.

    Decoding state (a tuple whose tensors all have the batch in dim 0, the layout
    :mod:`common.decoding` expands and reorders): ``(h, c, regions, projected_regions, mask)``.
    """

    def __init__(self, cfg: Att2inConfig, bos: int, pad: Optional[int] = None):
        super().__init__()
        self.cfg = cfg
        self.bos, self.pad = bos, pad
        self.word_embed = nn.Sequential(nn.Embedding(cfg.vocab_size, cfg.embed_dim), nn.ReLU(),
                                        nn.Dropout(cfg.dropout))
        self.region_embed = nn.Sequential(nn.Linear(cfg.feature_dim, cfg.rnn_size), nn.ReLU(),
                                          nn.Dropout(cfg.dropout))
        self.core = Att2inCore(cfg)
        self.logit = nn.Linear(cfg.rnn_size, cfg.vocab_size)
        never = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        never[[i for i in (bos, pad) if i is not None]] = True
        self.register_buffer("never_emitted", never, persistent=False)

    # ----------------------------------------------------------------- encoding ----
    def encode(self, features: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
        """Initial decoding state for region ``features [B, K, D]`` and ``mask [B, K]`` (True = real)."""
        if features.dim() != 3 or mask.shape != features.shape[:2] or mask.dtype != torch.bool:
            raise ValueError(f"features must be [B, K, D] with a boolean mask [B, K]; got {tuple(features.shape)} "
                             f"and {mask.dtype} {tuple(mask.shape)}")
        if features.shape[-1] != self.cfg.feature_dim:
            raise ValueError(f"the model expects {self.cfg.feature_dim}-d region features, got {features.shape[-1]}-d; "
                             f"set model.feature_dim to the feature file's width")
        regions = self.region_embed(features)
        projected = self.core.attention.project_memory(regions)
        zeros = regions.new_zeros(features.shape[0], self.cfg.rnn_size)
        return zeros, zeros, regions, projected, mask

    # ----------------------------------------------------------------- one step ----
    def log_probs(self, output: Tensor) -> Tensor:
        """``log p(w)`` from the core's (dropped-out) output ``[..., rnn_size]``."""
        logits = self.logit(output).float().masked_fill(self.never_emitted, float("-inf"))
        return torch.log_softmax(logits, dim=-1)

    def step_with_attention(self, tokens: Tensor, state: tuple[Tensor, ...]):
        """``(log_probs [N, V], new_state, attention weights [N, K])`` after feeding ``tokens [N]``."""
        h, c, regions, projected, mask = state
        output, h, c, weights = self.core(self.word_embed(tokens), h, c, regions, projected, mask)
        return self.log_probs(output), (h, c, regions, projected, mask), weights

    def step(self, tokens: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The ``step`` of :func:`common.decoding.greedy_search` / ``beam_search``."""
        log_probs, state, _ = self.step_with_attention(tokens, state)
        return log_probs, state

    # ----------------------------------------------------------------- training ----
    def forward(self, features: Tensor, mask: Tensor, captions: Tensor, ss_prob: float = 0.0) -> Tensor:
        """Log-probabilities ``[B*S, L-1, V]`` of ``captions[:, :, 1:]`` given the words before.

        ``captions`` is ``[B, S, L]`` (S captions per image, each ``<bos> w_1 .. <eos> <pad>..``).
        Scheduled sampling (Bengio et al., 2015; self-critical's ``ss_prob``): from the second
        step on, each caption's input word is, with probability ``ss_prob``, drawn from the
        model's previous output distribution instead of the ground truth.

        The output layer runs once over all steps (one large matrix product forward and
        backward instead of one per step); sampled inputs use the same distribution, computed
        without gradient (for every row, so that nothing depends on how many rows the coin picks).
        """
        batch, per_image, length = captions.shape
        h, c, regions, projected, mask = (t.repeat_interleave(per_image, dim=0) for t in self.encode(features, mask))
        captions = captions.reshape(batch * per_image, length)
        outputs = []
        for t in range(length - 1):
            tokens = captions[:, t]
            if t >= 1 and ss_prob > 0:  # every row draws, the coin picks (no data-dependent shapes: no host read)
                with torch.no_grad():
                    drawn = torch.multinomial(self.log_probs(outputs[-1]).exp(), 1).squeeze(1)
                tokens = torch.where(torch.rand(tokens.shape, device=tokens.device) < ss_prob, drawn, tokens)
            output, h, c, _ = self.core(self.word_embed(tokens), h, c, regions, projected, mask)
            outputs.append(output)
        return self.log_probs(torch.stack(outputs, dim=1))

    # ----------------------------------------------------------------- attention maps --
    @torch.no_grad()
    def attention_maps(self, features: Tensor, mask: Tensor, tokens: Tensor) -> dict:
        """Posterior attention at every step of feeding ``<bos> tokens`` and, for BAM with a
        contextual prior, the prior ``pi`` over the regions (the same for every step).

        Returns ``{"posterior": [B, T, K], "prior": [B, K] or None}``; ``tokens [B, T]`` are the
        generated words (the weights at step t are those used to predict ``tokens[:, t]``).
        """
        state = self.encode(features, mask)
        step_input = torch.full_like(tokens[:, 0], self.bos)
        posterior = []
        for t in range(tokens.shape[1]):
            _, state, weights = self.step_with_attention(step_input, state)
            posterior.append(weights)
            step_input = tokens[:, t]
        normalizer = self.core.attention.normalizer
        prior = None
        if getattr(normalizer, "prior_net", None) is not None:
            projected = state[3]
            scores = projected.new_zeros(projected.shape[0], 1, 1, projected.shape[1])
            prior = normalizer.prior_weights(scores, mask=mask[:, None, None, :],
                                             keys=projected.unsqueeze(1))[:, 0, 0]
        return {"posterior": torch.stack(posterior, dim=1), "prior": prior}

    # ----------------------------------------------------------------- decoding ----
    @torch.no_grad()
    def generate(self, features: Tensor, mask: Tensor, eos: int, max_length: int = 16, beam_size: int = 1,
                 length_penalty: float = 0.0) -> Tensor:
        """Word ids ``[B, T]`` (without ``<bos>``; ``<eos>`` then ``<pad>`` after a caption ends):
        greedy search for ``beam_size=1``, batched beam search otherwise (:mod:`common.decoding`),
        ranking finished captions by ``sum log p / length ** length_penalty`` (0: the plain sum,
        as self-critical.pytorch's default ``--length_penalty ''``)."""
        state = self.encode(features, mask)
        if beam_size == 1:
            return greedy_search(self.step, state, features.shape[0], self.bos, eos, max_length, pad=self.pad)
        tokens, _ = beam_search(self.step, state, features.shape[0], self.bos, eos, max_length,
                                beam_size=beam_size, length_penalty=length_penalty, pad=self.pad)
        return tokens


def caption_nll(log_probs: Tensor, captions: Tensor, pad: int) -> Tensor:
    """Mean ``-log p(w_t | w_<t)`` over the real target words (``captions[..., 1:]`` that are not pad)."""
    targets = captions.reshape(-1, captions.shape[-1])[:, 1:]
    real = targets != pad
    picked = log_probs[real].gather(1, targets[real].unsqueeze(1))  # padded rows (-inf at pad) never touched
    return -picked.mean()
