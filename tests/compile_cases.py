"""One tiny training forward of every domain's model, for the ``torch.compile`` checks (CPU and CUDA).

:func:`build` returns ``(model, inputs, loss)``: ``loss(model(*inputs), aux)`` is the step's
objective as the domain's trainer forms it (task loss plus the collected auxiliary losses).
:data:`MODELS` x :data:`NORMALIZERS` is the grid of the issue's target; :data:`MAP_OPERATORS`
adds the map operators on the models that take them (the MT Transformer and MCAN).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

NORMALIZERS = ("softmax", "bam-wc", "bam-lc", "entmax")
MODELS = ("gat", "mcan", "lxmert", "att2in", "mt-lstm", "mt-transformer")
#: Attend options of the map operators (self-attention of the MT Transformer's encoder).
MAP_OPERATORS = {
    "predictive": {"cross_layer": {"kind": "predictive", "alpha": 0.5}},
    "evolving": {"cross_layer": {"kind": "evolving", "alpha": 0.5, "beta": 0.5}},
    "position": {"position": {"absolute": True, "relative": True, "max_len": 16}},
    "convoluted": {"convoluted": {"kind": "2d", "max_len": 16}},
    "span": {"span": {"max_span": 4, "ramp": 2}},
}


def training_step(model, loss: Callable) -> Callable:
    """``step(*inputs)``: the model's forward inside an auxiliary-loss collector, then its loss."""
    from common import attention

    def step(*inputs):
        with attention.aux_losses() as aux:
            out = model(*inputs)
        return loss(out, aux)
    return step


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def build(model: str, normalizer: str = "softmax", operator: str | None = None, device: str = "cpu"):
    """``(model, inputs, loss)`` of a tiny ``model`` in training mode (dropout off, so that compiled and
    eager steps can be compared) with ``normalizer`` in its attention, and ``operator`` of
    :data:`MAP_OPERATORS` (MT Transformer only).

    The inputs and the loss's targets are on ``device`` before the step: a copy from host memory inside
    the step would be a host synchronisation on a GPU (``tests/gpu/test_compile_cuda.py``)."""
    torch.manual_seed(0)
    net, inputs, loss, targets = _BUILDERS[model](normalizer, operator)
    net = net.to(device).train()
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    targets = tuple(t.to(device) for t in targets)
    return net, inputs, lambda out, aux: loss(out, aux, *targets)


def _gat(normalizer: str, operator):
    from graphattn.models import GAT

    g = _generator()
    nodes, edges = 30, 120
    index = torch.randint(0, nodes, (2, edges), generator=g)
    x = torch.randn(nodes, 8, generator=g)
    target = torch.randint(0, 3, (nodes,), generator=g)
    model = GAT(8, 3, hidden_channels=4, heads=2, dropout=0.0, attention=normalizer)
    return model, (x, index), lambda out, aux, target: F.cross_entropy(out, target) + aux.total(), (target,)


def _mcan(normalizer: str, operator):
    from vqa.mcan import MCAN, MCANConfig

    g = _generator()
    tokens = torch.randint(1, 50, (2, 6), generator=g)
    q_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    features = torch.randn(2, 5, 16, generator=g)
    r_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    target = (torch.rand(2, 7, generator=g) > 0.7).float()
    model = MCAN(MCANConfig(vocab_size=50, num_answers=7, feature_dim=16, word_dim=8, hidden=16, heads=2, ffn=32,
                            layers=2, dropout=0.0, flat_mlp=16, flat_out=16, attention=normalizer))
    return model, (tokens, q_mask, features, r_mask), lambda out, aux, target: (
        F.binary_cross_entropy_with_logits(out, target, reduction="sum") + 0.01 * aux.total()), (target,)


def _lxmert(normalizer: str, operator):
    from transformers import LxmertConfig, LxmertForQuestionAnswering

    from vqa.lxmert.adapt import Adaptation, adapt_lxmert

    config = LxmertConfig(vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=32, l_layers=1,
                          x_layers=1, r_layers=1, visual_feat_dim=8, max_position_embeddings=16, num_qa_labels=5,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = adapt_lxmert(LxmertForQuestionAnswering(config), Adaptation(normalizer=normalizer))
    g = _generator()
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    visual_mask = torch.tensor([[1] * 4, [1] * 3 + [0]])
    corners = torch.rand(2, 4, 2, generator=g) * 0.5
    inputs = (torch.randint(1, 50, (2, 6), generator=g) * mask, mask, torch.randn(2, 4, 8, generator=g),
              torch.cat([corners, corners + 0.4], -1), visual_mask)
    target = (torch.rand(2, 5, generator=g) > 0.7).float()

    def loss(out, aux, target):
        return F.binary_cross_entropy_with_logits(out.question_answering_score, target) + aux.total()
    return _Keywords(model, ("input_ids", "attention_mask", "visual_feats", "visual_pos",
                             "visual_attention_mask")), inputs, loss, (target,)


class _Keywords(torch.nn.Module):
    """Calls ``model`` with its positional inputs as the named keyword arguments (Hugging Face models)."""

    def __init__(self, model: torch.nn.Module, names: tuple):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)))


def _att2in(normalizer: str, operator):
    from captioning.models import Att2in, Att2inConfig

    g = _generator()
    features = torch.randn(2, 5, 16, generator=g)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    captions = torch.randint(3, 30, (2, 1, 6), generator=g)
    captions[:, :, 0] = 1
    model = Att2in(Att2inConfig(vocab_size=30, feature_dim=16, embed_dim=8, rnn_size=16, att_hidden=8, dropout=0.0,
                                attention=normalizer), bos=1, pad=0)
    target = captions[:, :, 1:].reshape(2, -1)
    return model, (features, mask, captions), lambda out, aux, target: (
        F.nll_loss(out.reshape(-1, out.shape[-1]), target.reshape(-1)) + aux.total()), (target,)


def _seq2seq_batch():
    g = _generator()
    src = torch.randint(3, 40, (2, 7), generator=g)
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 6), generator=g)
    return src, src != 0, tgt


def _mt_lstm(normalizer: str, operator):
    from mt.models.lstm import LSTMSeq2Seq

    src, src_mask, tgt = _seq2seq_batch()
    model = LSTMSeq2Seq(40, 40, 0, 0, emb_dim=8, enc_hidden=8, dec_hidden=16, attn_hidden=8, dropout=0.0,
                        normalizer=normalizer)
    return model, (src, src_mask, tgt[:, :-1]), _seq2seq_loss, (tgt[:, 1:],)


def _mt_transformer(normalizer: str, operator):
    from mt.models.transformer import TransformerSeq2Seq

    src, src_mask, tgt = _seq2seq_batch()
    encoder = {"normalizer": normalizer, **(MAP_OPERATORS[operator] if operator else {})}
    model = TransformerSeq2Seq(40, 40, 0, 0, dim=16, heads=2, ffn_dim=32, enc_layers=2, dec_layers=1, dropout=0.0,
                               encoder_attention=encoder, decoder_attention={"normalizer": normalizer},
                               cross_attention={"normalizer": normalizer}, max_positions=16)
    return model, (src, src_mask, tgt[:, :-1]), _seq2seq_loss, (tgt[:, 1:],)


def _seq2seq_loss(out, aux, gold: torch.Tensor):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), gold.reshape(-1)) + aux.total()


_BUILDERS = {"gat": _gat, "mcan": _mcan, "lxmert": _lxmert, "att2in": _att2in, "mt-lstm": _mt_lstm,
             "mt-transformer": _mt_transformer}
