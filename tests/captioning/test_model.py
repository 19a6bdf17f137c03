import pytest
import torch

from captioning.models import Att2in, Att2inConfig
from common import attention
from common.decoding import beam_search, greedy_search

V, BOS, EOS, PAD = 30, 2, 3, 0


def _model(normalizer="softmax", seed=0, **options):
    torch.manual_seed(seed)
    cfg = Att2inConfig(vocab_size=V, feature_dim=12, embed_dim=16, rnn_size=16, att_hidden=8, dropout=0.0,
                       attention=normalizer, attention_options=options)
    return Att2in(cfg, bos=BOS, pad=PAD).eval()


def _batch(b=4, k=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    features = torch.rand(b, k, 12, generator=g)
    mask = torch.ones(b, k, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    features[~mask] = 0
    return features, mask


def test_beam_one_equals_greedy():
    model = _model()
    features, mask = _batch()
    greedy = model.generate(features, mask, EOS, max_length=12, beam_size=1)
    beam, _ = beam_search(model.step, model.encode(features, mask), 4, BOS, EOS, 12, beam_size=1, pad=PAD)
    assert torch.equal(greedy, beam)
    assert torch.equal(greedy, greedy_search(model.step, model.encode(features, mask), 4, BOS, EOS, 12, pad=PAD))


def test_beam_search_finds_a_caption_at_least_as_likely_as_greedy():
    model = _model(seed=3)
    features, mask = _batch()

    def log_likelihood(tokens):
        state, total = model.encode(features, mask), torch.zeros(len(tokens))
        inputs = torch.full((len(tokens),), BOS)
        alive = torch.ones(len(tokens), dtype=torch.bool)
        for t in range(tokens.shape[1]):
            log_probs, state = model.step(inputs, state)
            total += torch.where(alive, log_probs.gather(1, tokens[:, t:t + 1]).squeeze(1), torch.zeros(()))
            alive &= tokens[:, t] != EOS
            inputs = tokens[:, t]
        return total

    greedy = model.generate(features, mask, EOS, 10, beam_size=1)
    beam, scores = beam_search(model.step, model.encode(features, mask), 4, BOS, EOS, 10, beam_size=5,
                               length_penalty=0.0, pad=PAD)
    assert torch.all(log_likelihood(beam) >= log_likelihood(greedy) - 1e-5)
    assert torch.allclose(scores, log_likelihood(beam), atol=1e-4)


def test_never_emits_pad_or_bos_and_probabilities_normalise():
    model = _model()
    features, mask = _batch()
    log_probs, _ = model.step(torch.full((4,), BOS), model.encode(features, mask))
    assert torch.all(log_probs[:, [PAD, BOS]] == float("-inf"))
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(4))


def test_teacher_forced_forward_equals_stepping():
    model = _model()
    features, mask = _batch()
    captions = torch.randint(4, V, (4, 2, 6))
    captions[..., 0] = BOS
    out = model(features, mask, captions)
    assert out.shape == (8, 5, V)
    state = tuple(t.repeat_interleave(2, 0) for t in model.encode(features, mask))
    flat = captions.reshape(8, 6)
    for t in range(5):
        log_probs, state = model.step(flat[:, t], state)
        assert torch.allclose(out[:, t], log_probs, atol=1e-6)


def test_scheduled_sampling_feeds_model_samples():
    model = _model()
    features, mask = _batch()
    captions = torch.randint(4, V, (4, 1, 6))
    captions[..., 0] = BOS
    torch.manual_seed(0)
    forced = model(features, mask, captions, ss_prob=0.0)
    sampled = model(features, mask, captions, ss_prob=1.0)
    assert torch.allclose(forced[:, 0], sampled[:, 0])      # the first input is always <bos>
    assert not torch.allclose(forced[:, 1:], sampled[:, 1:])


@pytest.mark.parametrize("normalizer", ["softmax", "bam-wc", "entmax15"])
def test_padded_regions_get_zero_attention_and_change_nothing(normalizer):
    model = _model(normalizer)
    features, mask = _batch()
    tokens = torch.randint(4, V, (4, 5))
    maps = model.attention_maps(features, mask, tokens)
    assert torch.all(maps["posterior"][~mask.unsqueeze(1).expand_as(maps["posterior"])] == 0)
    assert torch.allclose(maps["posterior"].sum(-1), torch.ones(4, 5), atol=1e-5)
    # the same image with only its real regions gives the same log-probabilities
    alone = model.step(tokens[3, :1], model.encode(features[3:4, :2], mask[3:4, :2]))[0]
    batched = model.step(tokens[:, 0], model.encode(features, mask))[0][3:4]
    assert torch.allclose(alone, batched, atol=1e-5)


def test_bam_prior_is_a_distribution_over_real_regions():
    model = _model("bam-wc")
    features, mask = _batch()
    prior = model.attention_maps(features, mask, torch.randint(4, V, (4, 3)))["prior"]
    assert prior.shape == mask.shape
    assert torch.all(prior[~mask] == 0) and torch.allclose(prior.sum(-1), torch.ones(4), atol=1e-6)
    assert _model("softmax").attention_maps(features, mask, torch.randint(4, V, (4, 3)))["prior"] is None


def test_bam_training_collects_a_kl_with_gradient_per_step():
    model = _model("bam-wc").train()
    features, mask = _batch()
    captions = torch.randint(4, V, (4, 1, 6))
    captions[..., 0] = BOS
    with attention.aux_losses() as aux:
        model(features, mask, captions)
    assert len(aux) == 5 and torch.isfinite(aux.total())
    aux.total().backward()
    assert model.core.attention.normalizer.prior_net.hidden.weight.grad.abs().sum() > 0


def test_wrong_feature_width_is_a_clear_error():
    model = _model()
    with pytest.raises(ValueError, match="model.feature_dim"):
        model.encode(torch.zeros(2, 3, 2048), torch.ones(2, 3, dtype=torch.bool))
