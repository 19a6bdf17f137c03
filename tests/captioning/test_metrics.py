import subprocess
import sys

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from captioning.data import CaptionCorpus
from captioning import metrics
from captioning.metrics import coco_results, score_captions, spice_unavailable_reason


def test_scores_equal_calling_pycocoevalcap_directly(coco_fixture):
    corpus = CaptionCorpus(coco_fixture["prepared"])
    images = corpus.split("train")[:8]
    references = corpus.references(images)
    # a mix of exact, partial and wrong captions, with the punctuation the tokenizer removes
    predictions = {i: (refs[k % 5] if k % 3 else "A dog, on the grass!") for k, (i, refs) in
                   enumerate(references.items())}
    ours = score_captions(predictions, references)

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": c} for c in refs] for i, refs in references.items()})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in predictions.items()})
    bleu, _ = Bleu(4).compute_score(gts, res)
    direct = {f"Bleu_{n + 1}": b for n, b in enumerate(bleu)}
    direct["METEOR"], _ = Meteor().compute_score(gts, res)
    direct["ROUGE_L"], _ = Rouge().compute_score(gts, res)
    direct["CIDEr"], _ = Cider().compute_score(gts, res)
    for name, value in direct.items():
        assert ours[name] == pytest.approx(value, abs=1e-12), name
    assert 0 < ours["CIDEr"] < 10 and 0 < ours["Bleu_4"] < 1
    if spice_unavailable_reason() is None:
        assert "SPICE" in ours
    else:
        assert ours["skipped"]["SPICE"] == spice_unavailable_reason() and "get_stanford_models" in ours["skipped"]["SPICE"]


def test_input_errors_and_results_format():
    with pytest.raises(ValueError, match="no references for image ids \\[2\\]"):
        score_captions({1: "a", 2: "b"}, {1: ["a"]}, ["bleu"])
    with pytest.raises(ValueError, match="unknown caption metrics"):
        score_captions({1: "a"}, {1: ["a"]}, ["bleurt"])
    assert coco_results({5: "a cat", 2: "a dog"}) == [{"image_id": 2, "caption": "a dog"},
                                                        {"image_id": 5, "caption": "a cat"}]


def test_the_java_tokenizer_prints_no_progress_lines(capfd):
    assert score_captions({1: "a dog runs"}, {1: ["a dog is running", "dog runs"]}, ["bleu"])["Bleu_1"] > 0
    captured = capfd.readouterr()
    assert "PTBTokenizer" not in captured.err and "PTBTokenizer" not in captured.out


def test_other_lines_on_stderr_stay_visible_while_the_tokenizer_runs(capfd):
    child = ("import sys; sys.stderr.write('PTBTokenizer tokenized 16 tokens at 119.18 tokens per second.\\n"
             "Exception in thread main: java.lang.NoClassDefFoundError\\n')")
    with metrics._without_tokenizer_progress():
        subprocess.run([sys.executable, "-c", child], check=True)
        print("python's own warning", file=sys.stderr)
    assert sorted(capfd.readouterr().err.splitlines()) == ["Exception in thread main: java.lang.NoClassDefFoundError",
                                                          "python's own warning"]
