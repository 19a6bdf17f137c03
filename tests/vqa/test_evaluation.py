"""The official VQA accuracy on hand-computed cases, and the official results format."""
import json

import pytest

from vqa.evaluation import load_submission, question_accuracy, vqa_accuracy, write_submission


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
    # articles: 'a dog' -> 'dog', unanimous annotators
    ("a dog", humans(("dog", 10)), 1.0),
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
def test_question_accuracy_hand_computed(prediction, answers, expected):
    assert question_accuracy(prediction, answers) == pytest.approx(expected)


def test_unanimous_human_answers_are_not_processed():
    # official quirk: punctuation processing only when the ten answers differ ...
    assert question_accuracy("yes", ["yes!"] * 10) == 0.0
    # ... and then '!' becomes a space that is never stripped: 'yes ' matches nothing
    assert question_accuracy("yes", ["yes!"] * 9 + ["yes"]) == pytest.approx(0.3)
    # the same answer is scored 0 or 1 depending on whether the annotators all agree
    assert question_accuracy("t-shirt", ["t-shirt"] * 10) == 0.0            # 't shirt' vs 't-shirt'
    assert question_accuracy("t-shirt", ["t-shirt"] * 9 + ["shirt"]) == 1.0  # both become 't shirt'


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
