"""A tiny model memorises 20 real Multi30k sentence pairs (BLEU > 90 with our decoding and BLEU)."""
import pytest
import torch
import torch.nn.functional as F

from common.text import Vocabulary
from mt.batching import collate
from mt.bleu import tokenised_bleu
from mt.data import ParallelData, build_vocab
from mt.models import build_model
from mt.text import read_lines
from mt.translation import ids_to_text, translate_ids


@pytest.mark.realdata
@pytest.mark.parametrize("options", [
    dict(arch="lstm", emb_dim=64, enc_hidden=64, enc_layers=1, dec_hidden=96, dec_layers=1, attn_hidden=64,
         dropout=0.0),
    dict(arch="transformer", dim=64, heads=4, ffn_dim=128, enc_layers=2, dec_layers=2, dropout=0.0, pre_norm=True,
         encoder_attention={"cross_layer": {"kind": "predictive", "alpha": 0.1}}),
], ids=["lstm", "transformer-predictive"])
def test_tiny_model_overfits_twenty_pairs(attn_data_root, options):
    base = attn_data_root / "mt/multi30k/tok"
    src_lines = read_lines(base / "train.lc.norm.tok.de.gz")[:20]
    tgt_lines = read_lines(base / "train.lc.norm.tok.en.gz")[:20]
    src_vocab, tgt_vocab = build_vocab(src_lines), build_vocab(tgt_lines)
    assert isinstance(src_vocab, Vocabulary)
    data = ParallelData.encode(src_lines, tgt_lines, src_vocab, tgt_vocab)
    batch = collate(data.src, data.tgt, range(20), src_vocab.pad, tgt_vocab.pad)
    torch.manual_seed(0)
    model = build_model(options, len(src_vocab), len(tgt_vocab), src_vocab.pad, tgt_vocab.pad)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(100):
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=tgt_vocab.pad)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ids = translate_ids(model, data.src, src_vocab.pad, tgt_vocab, beam_size=4, batch_size=8)
    hyps = ids_to_text(ids, tgt_vocab)
    assert tokenised_bleu(hyps, tgt_lines) > 90
    greedy = ids_to_text(translate_ids(model, data.src, src_vocab.pad, tgt_vocab, beam_size=1), tgt_vocab)
    assert tokenised_bleu(greedy, tgt_lines) > 90
