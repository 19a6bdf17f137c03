"""The attentional LSTM seq2seq of Deng et al. 2018 (``harvardnlp/var-attn``), the BAM paper's MT base.

Encoder: embeddings, a bidirectional LSTM (``enc_hidden`` per direction) giving the memory
``m_j = [h_j^fwd; h_j^bwd]``. Decoder (Luong et al. 2015 with input feeding)::

    s_t   = LSTM([E y_{t-1}; h~_{t-1}], s_{t-1})
    a_t   = normalizer(v^T tanh(W_q s_t + W_m m_j))        (common.attention.AdditiveAttention)
    c_t   = sum_j a_tj m_j
    h~_t  = tanh(W_o [c_t; s_t])                            (fed to the next step)
    p(y_t) = softmax(W_g h~_t)

The decoder starts from a linear bridge of the encoder's final states. BAM normalizers add
their KL to an active ``common.attention.aux_losses()`` collector, averaged over decoder steps.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from common.attention import AdditiveAttention, add_aux_loss, aux_losses, collecting
from common.utils.runtime import LSTM

State = Dict[str, Tensor]


class LSTMSeq2Seq(nn.Module):
    """Args mirror ``var-attn``'s ``train_soft_b6``: embeddings 512, encoder 2 x 512 per
    direction, decoder 2 x 768, attention 512, dropout 0.3, uniform init +-0.1."""

    def __init__(self, src_vocab: int, tgt_vocab: int, src_pad: int, tgt_pad: int, emb_dim: int = 512,
                 enc_hidden: int = 512, enc_layers: int = 2, dec_hidden: int = 768, dec_layers: int = 2,
                 attn_hidden: int = 512, dropout: float = 0.3, normalizer: str = "softmax",
                 normalizer_options: Optional[dict] = None, init_range: float = 0.1):
        super().__init__()
        self.dec_layers, self.dec_hidden = dec_layers, dec_hidden
        self.src_embed = nn.Embedding(src_vocab, emb_dim, padding_idx=src_pad)
        self.tgt_embed = nn.Embedding(tgt_vocab, emb_dim, padding_idx=tgt_pad)
        self.encoder = LSTM(emb_dim, enc_hidden, enc_layers, batch_first=True, bidirectional=True,
                               dropout=dropout if enc_layers > 1 else 0.0)
        memory_dim = 2 * enc_hidden
        self.bridge = nn.Linear(2 * memory_dim, 2 * dec_layers * dec_hidden)
        self.cells = nn.ModuleList(nn.LSTMCell(emb_dim + dec_hidden if i == 0 else dec_hidden, dec_hidden)
                                   for i in range(dec_layers))
        self.attention = AdditiveAttention(dec_hidden, memory_dim, attn_hidden, normalizer, normalizer_options)
        self.combine = nn.Linear(memory_dim + dec_hidden, dec_hidden, bias=False)
        self.generator = nn.Linear(dec_hidden, tgt_vocab)
        self.dropout = nn.Dropout(dropout)
        for p in self.parameters():
            nn.init.uniform_(p, -init_range, init_range)
        with torch.no_grad():
            self.src_embed.weight[src_pad].zero_()
            self.tgt_embed.weight[tgt_pad].zero_()

    # -------------------------------------------------------------------- encoder ----
    def encode(self, src: Tensor, src_mask: Tensor) -> State:
        """The decoding state for ``src [B, S]`` (``src_mask`` True = real token)."""
        lengths = src_mask.sum(1)
        if bool((lengths == 0).any()):
            raise ValueError("every source sentence needs at least one token (an eos)")
        packed = pack_padded_sequence(self.dropout(self.src_embed(src)), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, (h, c) = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        final = torch.cat([h[-2], h[-1], c[-2], c[-1]], -1)  # top layer, both directions
        h0, c0 = self.bridge(final).view(-1, 2, self.dec_layers, self.dec_hidden).unbind(1)
        memory = self.dropout(memory)
        return {"h": torch.tanh(h0), "c": c0, "feed": memory.new_zeros(memory.shape[0], self.dec_hidden),
                "memory": memory, "keys": self.attention.project_memory(memory), "mask": src_mask}

    # -------------------------------------------------------------------- decoder ----
    def _step(self, tokens: Tensor, state: State) -> State:
        """One decoder step; the new state's ``feed`` is ``h~_t``."""
        x = torch.cat([self.dropout(self.tgt_embed(tokens)), state["feed"]], -1)
        hs, cs = [], []
        for i, cell in enumerate(self.cells):
            h, c = cell(x, (state["h"][:, i], state["c"][:, i]))
            hs.append(h)
            cs.append(c)
            x = self.dropout(h)
        context, _ = self.attention(h, state["memory"], state["mask"], projected_memory=state["keys"])
        feed = torch.tanh(self.combine(torch.cat([context, h], -1)))
        return dict(state, h=torch.stack(hs, 1), c=torch.stack(cs, 1), feed=feed)

    def decode_step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """``common.decoding`` step: log-probabilities ``[N, V]`` of the next token."""
        state = self._step(tokens, state)
        return torch.log_softmax(self.generator(state["feed"]).float(), -1), state

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``[B, T, V]`` for decoder inputs ``tgt_in [B, T]``."""
        state = self.encode(src, src_mask)
        if not collecting():
            return self._unroll(tgt_in, state)
        with aux_losses() as per_step:  # one attention call per step: report the mean over steps
            logits = self._unroll(tgt_in, state)
        for name, value in per_step.by_name().items():
            add_aux_loss(name, value / tgt_in.shape[1])
        return logits

    def _unroll(self, tgt_in: Tensor, state: State) -> Tensor:
        feeds = []
        for t in range(tgt_in.shape[1]):
            state = self._step(tgt_in[:, t], state)
            feeds.append(state["feed"])
        return self.generator(self.dropout(torch.stack(feeds, 1)))  # one projection for all steps
