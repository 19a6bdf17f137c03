"""The translation models: causality, masks, incremental decoding, auxiliary losses, config errors."""
import pytest
import torch

from common.attention import aux_losses
from mt.models import build_model

V_SRC, V_TGT, PAD = 30, 40, 0

LSTM = dict(arch="lstm", emb_dim=16, enc_hidden=16, enc_layers=2, dec_hidden=24, dec_layers=2, attn_hidden=16,
            dropout=0.0)
EVOLVING = {"kind": "evolving", "alpha": 0.3, "beta": 0.4}
TRANSFORMERS = {
    "plain": dict(arch="transformer", dim=16, heads=2, ffn_dim=32, enc_layers=2, dec_layers=2, dropout=0.0),
    "predictive-evolving-convoluted": dict(
        arch="transformer", dim=16, heads=2, ffn_dim=32, enc_layers=2, dec_layers=3, dropout=0.0, pre_norm=True,
        encoder_attention={"cross_layer": {"kind": "predictive", "alpha": 0.5},
                           "position": {"max_len": 16, "relative": True}},
        decoder_attention={"cross_layer": EVOLVING, "convoluted": {"kind": "2d"}, "temperature": True},
        cross_attention={"cross_layer": EVOLVING, "normalizer": "bam-wc"}),
}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V_SRC, (3, 7), generator=g)
    src[1, 5:] = PAD
    tgt = torch.randint(4, V_TGT, (3, 6), generator=g)
    return src, src.ne(PAD), tgt


def make(options, seed=0):
    torch.manual_seed(seed)
    return build_model(options, V_SRC, V_TGT, PAD, PAD).eval()


@pytest.mark.parametrize("options", [LSTM, *TRANSFORMERS.values()], ids=["lstm", *TRANSFORMERS])
def test_decoder_is_causal(options):
    """Changing target token t+1.. leaves the logits of positions <= t unchanged."""
    model = make(options)
    src, mask, tgt = batch()
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, V_TGT, changed[:, 3:].shape)
    with torch.no_grad():
        a, b = model(src, mask, tgt), model(src, mask, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("options", [LSTM, *TRANSFORMERS.values()], ids=["lstm", *TRANSFORMERS])
def test_source_padding_is_ignored(options):
    """Garbage in padded source positions does not change anything."""
    model = make(options)
    src, mask, tgt = batch()
    noisy = src.clone()
    noisy[1, 5:] = 7
    with torch.no_grad():
        torch.testing.assert_close(model(src, mask, tgt), model(noisy, mask, tgt))


@pytest.mark.parametrize("options", [LSTM, *TRANSFORMERS.values()], ids=["lstm", *TRANSFORMERS])
def test_step_by_step_decoding_equals_teacher_forcing(options):
    model = make(options)
    src, mask, tgt = batch()
    with torch.no_grad():
        full = torch.log_softmax(model(src, mask, tgt), -1)
        state = model.encode(src, mask)
        for t in range(tgt.shape[1]):
            log_probs, state = model.decode_step(tgt[:, t], state)
            torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(LSTM, normalizer="bam-wc"), TRANSFORMERS["predictive-evolving-convoluted"]],
                         ids=["lstm-bam-wc", "transformer-bam-wc-cross"])
def test_bam_kl_reaches_the_collector_with_gradient(options):
    model = make(options).train()
    src, mask, tgt = batch()
    with aux_losses() as aux:
        model(src, mask, tgt).sum()
    kl = aux.by_name()["bam_kl"]
    assert kl.item() > 0 and kl.requires_grad
    kl.backward()
    prior = [p for n, p in model.named_parameters() if "prior" in n]
    assert prior and any(p.grad is not None and p.grad.abs().sum() > 0 for p in prior)


def test_bad_model_options_name_the_key():
    with pytest.raises(ValueError, match="model.arch must be one of"):
        build_model({"arch": "gru"}, V_SRC, V_TGT, PAD, PAD)
    with pytest.raises(ValueError, match="hidden_size"):
        build_model({"arch": "lstm", "hidden_size": 3}, V_SRC, V_TGT, PAD, PAD)
    with pytest.raises(ValueError, match="unknown attention option"):
        build_model({"arch": "transformer", "dim": 8, "heads": 2, "encoder_attention": {"normaliser": "x"}},
                    V_SRC, V_TGT, PAD, PAD)
