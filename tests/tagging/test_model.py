"""The tagger: every variant and normalizer runs forward and backward, real words ignore the padding, the
variants put their options in the right layers, and the input widths and the character CNN by hand."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common import attention
from common.attention.maps.convoluted import ConvolutedAttention
from common.attention.maps.position import AbsolutePositionInteraction, RelativePositionInteraction
from common.attention.maps.temperature import LearnableTemperature
from tagging.data import Sentence, Vocabulary, collate, encode
from tagging.model import VARIANTS, CharCNN, Tagger

DIMS = dict(word_dim=16, char_dim=8, concat_position_dim=8, heads=2, layers=2, max_len=12, dropout=0.1)
TRAIN = [Sentence("the dog runs fast .".split(), ["DET", "NOUN", "VERB", "ADV", "PUNCT"]),
         Sentence("a cat sees the dog".split(), ["DET", "NOUN", "VERB", "DET", "NOUN"]),
         Sentence("dogs run".split(), ["NOUN", "VERB"])]
VOCAB = Vocabulary.build(TRAIN, vocab_fraction=1.0)
TAGS = ["NOUN"] * 9
#: Two chunks of different lengths; a third, longer one made of words no longer than theirs (so the character
#: width of the batch stays 5), and one with a longer word (a wider character matrix).
FIRST = Sentence("the dog runs fast .".split(), ["DET", "NOUN", "VERB", "ADV", "PUNCT"])
SECOND = Sentence("a zebra sees".split(), ["DET", "NOUN", "VERB"])
LONGER = Sentence("dogs run a cat the dog sees a cat".split(), TAGS)
LONGER_WORD = Sentence("dogs run a hippopotamus the dog sees a cat".split(), TAGS)


def chunks(*sentences):
    return encode(list(sentences), VOCAB, max_len=DIMS["max_len"])


def tagger(variant="pe-add", normalizer="softmax", **changes):
    torch.manual_seed(0)
    dims = {**DIMS, **changes}
    return Tagger(len(VOCAB.words), len(VOCAB.chars), len(VOCAB.tags), variant,
                  attention={"normalizer": normalizer}, **dims)


def forward(model, batch):
    return model(batch.words, batch.chars, batch.char_index, batch.mask)


CASES = [(v, n) for n in ("softmax", "bam-wc", "entmax") for v in VARIANTS]


@pytest.mark.parametrize("variant, normalizer", CASES)
def test_every_variant_and_normalizer_runs_forward_and_backward(variant, normalizer):
    model = tagger(variant, normalizer)
    batch = collate(chunks(FIRST, SECOND))
    assert batch.words.shape == (2, 5)
    model.train()
    with attention.aux_losses() as aux:  # BAM's contextual prior is trained by its KL term only
        logits = forward(model, batch)
    assert logits.shape == (2, 5, 17) and torch.isfinite(logits).all()
    loss = F.cross_entropy(logits.flatten(0, 1), batch.tags.flatten(), ignore_index=-100)
    if normalizer.startswith("bam"):
        assert len(aux) == DIMS["layers"]
    (loss + aux.total()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
    # everything the loss reads trains: the embeddings, the character CNN, every layer's projections, the output
    for name, p in model.named_parameters():
        if name == "word_embed.weight":
            real = batch.words[batch.mask].unique()
            assert p.grad[real].abs().sum(-1).gt(0).all() and p.grad[0].eq(0).all()  # row 0 is padding
        elif name == "position_embed.weight":
            assert p.grad[:5].abs().sum(-1).gt(0).all() and p.grad[5:].eq(0).all()  # positions 5.. never occur
        elif "convoluted" in name and name.endswith("weight") and variant == "conv1d":
            assert p.grad[:, :5, :5].abs().sum() > 0  # filters and key channels beyond the 5 words stay unused
        elif "relative" in name:
            assert p.grad.abs().sum() > 0
        elif name.endswith("bias") and ("convoluted" in name or "conv.bias" in name):
            continue  # a ReLU'd bias can be dead on a tiny batch
        elif name.endswith("prior_net.out.bias"):
            continue  # shifts every key's prior logit alike, and the prior is a softmax over keys: zero gradient
        else:
            assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("variant, normalizer", CASES)
def test_real_words_do_not_depend_on_the_padding_of_the_batch(variant, normalizer):
    model = tagger(variant, normalizer).eval()
    two = collate(chunks(FIRST, SECOND))
    three = collate(chunks(FIRST, SECOND, LONGER))
    assert three.words.shape == (3, 9) and three.chars.shape[1] == two.chars.shape[1] == 5
    with torch.no_grad():
        a, b = forward(model, two), forward(model, three)[:2, :5]
    assert torch.allclose(a[two.mask], b[two.mask], atol=1e-5)
    # and the batch's other rows do not matter either: each chunk alone gives the same logits
    with torch.no_grad():
        alone = forward(model, collate(chunks(SECOND)))
    assert torch.allclose(alone[0], a[1, :3], atol=1e-5)


def test_real_words_do_not_depend_on_the_longest_word_of_the_batch():
    model = tagger("pe-add").eval()
    two = collate(chunks(FIRST, SECOND))
    three = collate(chunks(FIRST, SECOND, LONGER_WORD))
    assert three.chars.shape[1] == 12 > two.chars.shape[1]
    with torch.no_grad():
        a, b = forward(model, two), forward(model, three)[:2, :5]
    assert torch.allclose(a[two.mask], b[two.mask], atol=1e-5)


# ------------------------------------------------------------------ character CNN ----
def _charcnn_alone_vs_padded(layers):
    torch.manual_seed(0)
    cnn = CharCNN(num_chars=12, dim=8, layers=layers)
    with torch.no_grad():
        for conv in cnn.convs:
            conv.bias.fill_(0.5)  # a positive bias: padded positions are > 0 after the ReLU unless masked
    word = torch.tensor([[3, 4, 5]])
    padded = torch.tensor([[3, 4, 5, 0, 0, 0, 0], [7, 8, 9, 10, 11, 2, 6]])  # batched with a longer word
    return cnn(word)[0], cnn(padded)[0]


def test_charcnn_max_pool_ignores_the_padding():
    alone, padded = _charcnn_alone_vs_padded(layers=1)
    assert alone.shape == (8,)
    assert torch.allclose(alone, padded, atol=1e-6)


def test_charcnn_word_vector_equals_the_word_computed_alone():
    alone, padded = _charcnn_alone_vs_padded(layers=3)
    assert torch.allclose(alone, padded, atol=1e-6)


def test_charcnn_is_three_width5_convolutions_with_a_padding_embedding():
    cnn = CharCNN(num_chars=12, dim=8)
    assert [(c.kernel_size, c.padding, c.in_channels, c.out_channels) for c in cnn.convs] == [((5,), (2,), 8, 8)] * 3
    assert cnn.embed.padding_idx == 0 and cnn.embed.weight[0].eq(0).all()


# ------------------------------------------------------------------ input widths ----
def test_pe_add_adds_positions_to_the_word_embeddings_by_hand():
    model = tagger("pe-add").eval()
    assert model.position_embed.weight.shape == (12, 16)
    assert model.layers[0].embed_dim == 16 + 8 and model.output.in_features == 2 * 24
    batch = collate(chunks(FIRST, SECOND))
    x = model.embed(batch.words, batch.chars, batch.char_index)
    assert x.shape == (2, 5, 24)
    W, P = model.word_embed.weight, model.position_embed.weight
    expected_words = W[batch.words] + P[:5]
    assert torch.allclose(x[..., :16], expected_words)
    assert torch.allclose(x[..., 16:], model.chars(batch.chars)[batch.char_index])


def test_pe_con_concatenates_positions_by_hand():
    model = tagger("pe-con").eval()
    assert model.position_embed.weight.shape == (12, 8)
    assert model.layers[0].embed_dim == 16 + 8 + 8 and model.output.in_features == 2 * 32
    batch = collate(chunks(FIRST, SECOND))
    x = model.embed(batch.words, batch.chars, batch.char_index)
    assert x.shape == (2, 5, 32)
    assert torch.equal(x[..., :16], model.word_embed.weight[batch.words])
    assert torch.equal(x[..., 16:24], model.position_embed.weight[:5].expand(2, 5, 8))
    assert torch.allclose(x[..., 24:], model.chars(batch.chars)[batch.char_index])


@pytest.mark.parametrize("variant", ["p", "r", "pr"])
def test_direct_position_variants_have_no_position_embedding(variant):
    model = tagger(variant)
    assert model.position_embed is None and model.layers[0].embed_dim == 24
    batch = collate(chunks(FIRST))
    x = model.embed(batch.words, batch.chars, batch.char_index)
    assert torch.equal(x[..., :16], model.word_embed.weight[batch.words])


def test_a_chunk_longer_than_max_len_and_bad_widths_are_errors():
    model = tagger("pe-add", max_len=4)
    batch = collate(chunks(FIRST))  # 5 words
    with pytest.raises(ValueError, match="max_len=4"):
        forward(model, batch)
    with pytest.raises(ValueError, match="divisible by heads=5"):
        tagger("pe-add", heads=5)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        tagger("nope")


# ------------------------------------------------------------------ where the options go ----
@pytest.mark.parametrize("variant, absolute, relative", [("p", True, False), ("r", False, True), ("pr", True, True),
                                                         ("pe-add", False, False), ("conv2d", False, False)])
def test_position_interactions_only_in_the_first_layer(variant, absolute, relative):
    model = tagger(variant, layers=3)
    first = model.layers[0].attend
    assert isinstance(first.absolute, AbsolutePositionInteraction) == absolute
    assert isinstance(first.relative, RelativePositionInteraction) == relative
    if absolute:
        assert first.absolute.table.shape == (2, 12, 12)
    if relative:
        assert first.relative.offsets.shape == (2, 2 * 12 - 1)
    for layer in model.layers[1:]:
        assert layer.attend.absolute is None and layer.attend.relative is None


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_heads_have_no_biases_and_no_output_projection(variant):
    model = tagger(variant)
    for layer in model.layers:
        assert layer.num_heads == 2 and layer.q_proj.bias is None and layer.v_proj.bias is None
        assert isinstance(layer.out_proj, torch.nn.Identity)
    has_temperature = [layer.temperature is not None for layer in model.layers]
    assert has_temperature == [variant == "temp"] * 2
    has_conv = [layer.attend.convoluted is not None for layer in model.layers]
    assert has_conv == [variant.startswith("conv")] * 2


def test_temp_has_gammas_in_every_layer():
    model = tagger("temp", layers=3)
    for layer in model.layers:
        assert isinstance(layer.temperature, LearnableTemperature)
        assert {k: v.detach().item() for k, v in layer.temperature.gamma.items()} == {"q": 1.0, "k": 1.0, "v": 1.0}
    gammas = [n for n, _ in model.named_parameters() if ".gamma." in n]
    assert len(gammas) == 9


@pytest.mark.parametrize("variant, kind", [("conv1d", "1d"), ("conv2d", "2d")])
def test_conv_variants_have_relu_glorot_convoluted_attention_in_every_layer(variant, kind):
    model = tagger(variant, layers=3)
    assert model.needs_query_mask
    for layer in model.layers:
        conv = layer.attend.convoluted
        assert isinstance(conv, ConvolutedAttention)
        assert (conv.kind, conv.activation, conv.init, conv.causal) == (kind, "relu", "glorot", False)
        weight = conv.weight if kind == "1d" else conv.conv.weight
        bias = conv.bias if kind == "1d" else conv.conv.bias
        if kind == "1d":
            assert conv.max_len == 12 and weight.shape == (2, 12, 12, 3)
            limit = (6 / (2 * 3 * 12)) ** 0.5
        else:
            assert weight.shape == (2, 1, 3, 3)
            limit = (6 / 18) ** 0.5
        assert weight.abs().max() <= limit and weight.std() > limit / 3  # glorot, not the identity init
        assert bias.eq(0).all()


def test_the_keras_initialisation_has_the_authors_scales():
    from tagging.model import EMBEDDING_RANGE

    torch.manual_seed(0)
    width, heads, t = 192, 4, 60
    model = Tagger(500, 60, 17, "pr", word_dim=128, char_dim=64, heads=heads, max_len=t)
    head_dim = width // heads
    for embed in (model.word_embed, model.chars.embed):
        rows = embed.weight[1:]
        assert rows.abs().max() <= EMBEDDING_RANGE and rows.abs().max() > 0.9 * EMBEDDING_RANGE
        assert not embed.weight[0].any()                      # padding stays zero
        assert rows.std().item() == pytest.approx(EMBEDDING_RANGE / 3 ** 0.5, rel=0.05)
    conv = model.chars.convs[0]
    limit = (6 / (64 * 5 + 64 * 5)) ** 0.5                       # Keras fans of a Conv1D count its width
    assert conv.weight.abs().max() <= limit and conv.weight.std().item() == pytest.approx(limit / 3 ** 0.5, rel=0.05)
    assert not conv.bias.any() and not model.output.bias.any()
    out_limit = (6 / (2 * width + 17)) ** 0.5
    assert model.output.weight.abs().max() <= out_limit
    first = model.layers[0]
    for proj in (first.q_proj, first.k_proj, first.v_proj):
        per_head = proj.weight.view(heads, head_dim, width)
        std = (2 / (width + head_dim)) ** 0.5                   # glorot_normal of one head's [width, head_dim]
        for block in per_head:
            assert block.std().item() == pytest.approx(std, rel=0.05)
            assert block.abs().max() <= 2 * std / 0.87962566103423978   # truncated at 2 sd of the raw normal
    table, offsets = first.attend.absolute.table, first.attend.relative.offsets
    assert table.std().item() == pytest.approx((2 / (2 * t)) ** 0.5, rel=0.05)
    assert offsets.std().item() == pytest.approx((2 / (2 * (2 * t) ** 0.5)) ** 0.5, rel=0.2)  # 119 x 4 draws
    torch.manual_seed(0)
    plain = Tagger(500, 60, 17, "pr", word_dim=128, char_dim=64, heads=heads, max_len=t, init="torch")
    assert plain.word_embed.weight[1:].std().item() == pytest.approx(1.0, rel=0.05)   # nn.Embedding's N(0, 1)
    assert not plain.layers[0].attend.absolute.table.any()
    with pytest.raises(ValueError, match="init='glorot': use one of keras, torch"):
        Tagger(500, 60, 17, "pe-add", init="glorot")
