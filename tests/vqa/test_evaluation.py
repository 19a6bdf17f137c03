"""The official VQA accuracy on hand-computed cases, and the official results format."""
import json

import pytest

from vqa import score
from vqa.evaluation import (RULES, format_answer_types, load_submission, py2_round, question_accuracy, vqa_accuracy,
                            write_submission)


def humans(*groups):
    out = []
    for answer, count in groups:
        out += [answer] * count
    assert len(out) == 10
    return out


@pytest.mark.parametrize("prediction, answers, expected", [
    # 3 matches: the 3 matching annotators' subsets see 2 (2/3), the other 7 see 3 (1): (3*2/3 + 7)/10
    ("dont know", humans(("don't know", 3), ("no", 7)), 0.9),
    # numbers as words: 'Two' -> '2'; 2 matches: (2*1/3 + 8*2/3)/10
    ("Two", humans(("2", 2), ("3", 8)), 0.6),
    # fewer than 3 matches: one annotator: (1*0 + 9*1/3)/10
    ("cat", humans(("cat", 1), ("dog", 9)), 0.3),
    # 4 matches: every subset has >= 3
    ("yes", humans(("yes", 4), ("no", 6)), 1.0),
    # no match
    ("blue", humans(("red", 5), ("green", 5)), 0.0),
    # digit comma removes punctuation; human answers get punctuation processing when they differ
    ("1,000", humans(("1000", 2), ("1,000", 1), ("many", 7)), 0.9),
    # a period is stripped from the prediction, a decimal point is not
    ("3.5.", humans(("3.5", 3), ("4", 7)), 0.9),
])
@pytest.mark.parametrize("rules", RULES)
def test_rules_agree_on_plain_disagreeing_annotators(prediction, answers, expected, rules):
    assert question_accuracy(prediction, answers, rules) == pytest.approx(expected)


@pytest.mark.parametrize("prediction, answers, official, legacy", [
    # the three rows of the issue: today's evaluator vs the pre-2021 one
    ("a dog", humans(("dog", 10)), 0.0, 1.0),                       # agreeing: raw strings compared
    ("2", humans(("two", 3), ("three", 7)), 0.9, 0.0),               # number words of the humans
    ("don't know", humans(("dont know", 4), ("no", 6)), 1.0, 0.0),    # contractions of the humans
    # whitespace: stripped from every answer today, only from the prediction before
    ("dog", humans(("dog ", 10)), 1.0, 0.0),
    (" dog\t", humans(("dog", 10)), 1.0, 1.0),
    ("dog", humans(("dog\n", 3), ("cat", 7)), 0.9, 0.0),
    # case: lower-cased only by process_digit_article, i.e. today only for disagreeing humans
    ("YES", humans(("yes", 10)), 0.0, 1.0),
    ("yes", humans(("Yes", 10)), 0.0, 0.0),
    ("yes", humans(("Yes", 3), ("no", 7)), 0.9, 0.0),
    # articles of disagreeing humans are dropped today
    ("dog", humans(("the dog", 4), ("cat", 6)), 1.0, 0.0),
    # punctuation: agreeing humans are never processed ...
    ("yes", humans(("yes!", 10)), 0.0, 0.0),
    ("t-shirt", humans(("t-shirt", 10)), 1.0, 0.0),
    # ... disagreeing ones are: 'yes!' -> 'yes ' -> 'yes' today (the split drops the space), 'yes ' before
    ("yes", humans(("yes!", 9), ("yes", 1)), 1.0, 0.3),
    ("t-shirt", humans(("t-shirt", 9), ("shirt", 1)), 1.0, 1.0),
])
def test_official_and_legacy_rules_hand_computed(prediction, answers, official, legacy):
    assert question_accuracy(prediction, answers) == pytest.approx(official)  # "official" is the default
    assert question_accuracy(prediction, answers, "official") == pytest.approx(official)
    assert question_accuracy(prediction, answers, "legacy-2016") == pytest.approx(legacy)


def test_unknown_rules_are_an_error():
    with pytest.raises(ValueError, match="unknown VQA evaluation rules 'v3'.*official, legacy-2016"):
        question_accuracy("yes", ["yes"] * 10, "v3")
    with pytest.raises(ValueError, match="unknown VQA evaluation rules"):
        vqa_accuracy([], {}, rules="new")


def test_python2_rounding():
    assert py2_round(0.125, 2) == 0.13 and round(0.125, 2) == 0.12  # exact half: away from zero
    assert py2_round(-0.125, 2) == -0.13 and py2_round(12.5, 0) == 13.0 and py2_round(13.5, 0) == 14.0
    assert py2_round(2.675, 2) == 2.67  # 2.675 is 2.67499999... in binary: not a half
    assert py2_round(100 * 2 / 3, 2) == 66.67


def _ann(qid, answers, answer_type, question_type):
    return {"question_id": qid, "image_id": 1, "answer_type": answer_type, "question_type": question_type,
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1} for i, a in enumerate(answers)]}


def test_overall_and_per_type_accuracy():
    annotations = [
        _ann(1, humans(("yes", 10)), "yes/no", "is the"),
        _ann(2, humans(("2", 2), ("3", 8)), "number", "how many"),
        _ann(3, humans(("cat", 1), ("dog", 9)), "other", "what is the"),
        _ann(4, humans(("no", 10)), "yes/no", "is the"),
    ]
    result = vqa_accuracy(annotations, {1: "yes", 2: "two", 3: "cat", 4: "yes"})
    assert result.overall == pytest.approx(round(100 * (1 + 0.6 + 0.3 + 0) / 4, 2))
    assert result.per_answer_type == {"number": 60.0, "other": 30.0, "yes/no": 50.0}
    assert result.per_question_type["is the"] == 50.0
    assert result.per_question == {1: 100.0, 2: 60.0, 3: 30.0, 4: 0.0}


def test_answer_types_read_as_a_phrase_in_the_papers_order():
    printed = format_answer_types({"number": 0.0, "other": 0.0, "yes/no": 75.64})
    assert printed == "yes/no 75.64, number 0.00, other 0.00"
    printed = format_answer_types({"other": 12.5, "colour": 3.0, "yes/no": 80.0})
    assert printed == "yes/no 80.00, other 12.50, colour 3.00"
    assert format_answer_types({}) == ""


def test_overall_accuracy_rounds_halves_away_from_zero():
    # one right answer out of 8 questions: 12.5 exactly; Python 3's round would give 12
    annotations = [_ann(q, humans(("yes", 10)), "yes/no", "is the") for q in range(8)]
    result = vqa_accuracy(annotations, {q: "yes" if q == 0 else "no" for q in range(8)}, digits=0)
    assert result.overall == 13.0 and result.per_answer_type == {"yes/no": 13.0}


def test_predictions_must_cover_the_annotated_questions():
    annotations = [_ann(1, humans(("yes", 10)), "yes/no", "is the")]
    with pytest.raises(ValueError, match="1 question ids without a prediction"):
        vqa_accuracy(annotations, {})
    with pytest.raises(ValueError, match="1 not annotated"):
        vqa_accuracy(annotations, {1: "yes", 2: "no"})


def test_submission_round_trip(tmp_path):
    path = write_submission(tmp_path / "results.json", {5: "yes", 3: "2"})
    rows = json.loads(path.read_text())
    assert rows == [{"question_id": 3, "answer": "2"}, {"question_id": 5, "answer": "yes"}]
    assert load_submission(path) == {3: "2", 5: "yes"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": 3}]))
    with pytest.raises(ValueError, match="bad.json.*prediction #0"):
        load_submission(bad)


@pytest.mark.parametrize("text, reason", [("", "the file is empty"), (" \n\n", "the file holds only blank lines"),
                                          ("[]", "the list is empty")])
def test_a_results_file_without_predictions_names_the_file_and_the_fix(tmp_path, text, reason):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_submission(path)
    assert str(err.value) == (f"{path}: no predictions: {reason}; write one with python -m vqa.evaluate (a list of "
                              f"{{question_id, answer}}, one per question)")


def _annotation_file(path, annotations):
    path.write_text(json.dumps({"info": {}, "license": {}, "data_subtype": "val2014", "data_type": "mscoco",
                                "annotations": annotations}))
    return path


def test_score_command_both_rules(tmp_path, capsys):
    annotations = _annotation_file(tmp_path / "ann.json", [
        _ann(1, humans(("dog", 10)), "other", "what is the"),
        _ann(2, humans(("two", 3), ("three", 7)), "number", "how many"),
    ])
    results = write_submission(tmp_path / "res.json", {1: "a dog", 2: "2"})
    assert score.main([str(results), str(annotations), "--out", str(tmp_path / "report.json")]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == [
        "overall 45.00 (2 questions, rules official)", "number 90.00", "other 0.00"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["overall"] == 45.0 and report["rules"] == "official" and report["per_question_type"]["how many"] == 90.0
    assert score.main([str(results), str(annotations), "--rules", "legacy-2016"]) == 0
    assert capsys.readouterr().out.startswith("overall 50.00 (2 questions, rules legacy-2016)")


def test_score_command_errors_name_the_file(tmp_path, capsys):
    annotations = _annotation_file(tmp_path / "ann.json", [_ann(1, humans(("dog", 10)), "other", "what is the")])
    results = write_submission(tmp_path / "res.json", {1: "dog", 7: "cat"})
    assert score.main([str(results), str(annotations)]) == 2
    assert "res.json against" in capsys.readouterr().err
    assert score.main([str(tmp_path / "none.json"), str(annotations)]) == 2
    assert "results file" in capsys.readouterr().err
    bad = tmp_path / "bad_ann.json"
    bad.write_text(json.dumps({"annotations": [{"question_id": "x"}]}))
    assert score.main([str(results), str(bad)]) == 2
    assert "bad_ann.json: annotations[0] field 'question_id'" in capsys.readouterr().err
