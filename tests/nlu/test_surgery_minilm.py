"""The model surgery on the real pretrained MiniLM-L6 (all-MiniLM-L6-v2): a softmax swap equals the
unswapped model to 1e-5 in eval and train mode, and BAM-WC's mean weights (eval mode) are the softmax."""
from __future__ import annotations

import copy

import pytest
import torch

from common.attention import aux_losses
from common.attention.surgery import swap_attention
from nlu.model import load_classifier, load_tokenizer
from nlu.tasks import get_task

pytestmark = pytest.mark.realdata

PAIRS = (["The cat sat on the mat.", "A short one."], ["A cat was sitting on a mat, it seems.", "Quite a lot longer "
                                                                                              "than the first text."])


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    torch.manual_seed(0)
    model, new_keys = load_classifier(minilm_dir, get_task("MRPC"), None)
    batch = load_tokenizer(minilm_dir)(*PAIRS, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0  # padding is exercised
    return model, new_keys, dict(batch)


def test_only_the_classifier_head_is_new(minilm):
    _, new_keys, _ = minilm
    assert new_keys == ["classifier.bias", "classifier.weight"]


@pytest.mark.parametrize("train", [False, True])
def test_softmax_swap_of_the_real_minilm_is_exact(minilm, train):
    original, _, batch = minilm
    swapped = copy.deepcopy(original)
    assert len(swap_attention(swapped, "softmax")) == 6
    original.train(train)
    swapped.train(train)
    torch.manual_seed(1)
    expected = original(**batch).logits
    torch.manual_seed(1)
    actual = swapped(**batch).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_bam_wc_on_the_real_minilm_is_the_softmax_in_eval_mode_and_samples_in_training(minilm):
    original, _, batch = minilm
    original.eval()
    swapped = copy.deepcopy(original)
    swap_attention(swapped, {"normalizer": "bam-wc", "normalizer_options": {"k": 10}})
    with torch.no_grad():
        torch.testing.assert_close(swapped(**batch).logits, original(**batch).logits, atol=1e-5, rtol=0)
        swapped.train()
        with aux_losses() as aux:
            sampled = swapped(**batch).logits
    assert len(aux) == 6 and torch.isfinite(aux.total()) and aux.total() > 0
    assert not torch.allclose(sampled, original(**batch).logits, atol=1e-3)
