"""BLEU: our two numbers equal calling sacrebleu directly."""
import random

import pytest
import sacrebleu

from mt.bleu import detokenised_bleu, tokenised_bleu
from mt.text import MosesDetokenizer, read_lines

REFS = ["a man in a blue shirt is standing on a ladder .", "two dogs play in the snow .",
        "a woman &apos;s bag is red .", "children are sitting on a bench ."]
HYPS_BPE = ["a man in a blue sh@@ irt stands on a ladder .", "two dogs are playing in snow .",
            "a woman &apos;s bag is red .", "kids sit on a bench ."]


def test_tokenised_bleu_equals_sacrebleu_on_debpe_text():
    expected = sacrebleu.corpus_bleu([h.replace("@@ ", "") for h in HYPS_BPE], [REFS], tokenize="none").score
    assert tokenised_bleu(HYPS_BPE, REFS) == pytest.approx(expected)
    assert 0 < expected < 100
    assert tokenised_bleu(REFS, REFS) == pytest.approx(100.0)


def test_detokenised_bleu_equals_sacrebleu_with_signature():
    raw_refs = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow.",
                "A woman's bag is red.", "Children are sitting on a bench."]
    detok = MosesDetokenizer("en")
    hyps = [detok(h.replace("@@ ", "")) for h in HYPS_BPE]
    expected = sacrebleu.corpus_bleu(hyps, [raw_refs], lowercase=True)
    result = detokenised_bleu(HYPS_BPE, raw_refs, "en")
    assert result["score"] == pytest.approx(expected.score)
    assert "case:lc" in result["signature"] and "tok:13a" in result["signature"]


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 hypotheses but 4 references"):
        tokenised_bleu(HYPS_BPE[:3], REFS)


@pytest.mark.realdata
def test_tokenised_bleu_on_real_iwslt_text(attn_data_root):
    """On real BPE text: the BPE side scored against the tokenised side is 100, a perturbed copy matches sacrebleu."""
    base = attn_data_root / "mt/iwslt14_de_en"
    bpe, tok = read_lines(base / "test.en.bpe.gz")[:300], read_lines(base / "test.en.gz")[:300]
    assert tokenised_bleu(bpe, tok) == pytest.approx(100.0)
    rng = random.Random(0)
    noisy = [" ".join(w for w in line.split() if rng.random() > 0.2) for line in bpe]
    expected = sacrebleu.corpus_bleu([n.replace("@@ ", "").replace("@@", "") for n in noisy], [tok],
                                     tokenize="none").score
    assert tokenised_bleu(noisy, tok) == pytest.approx(expected, abs=1e-9)
