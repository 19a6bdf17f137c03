"""The data root: a named one must exist (nothing is created for a wrong path); the cache is the default."""
import pytest

from common.utils import DataRootError, default_data_root
from common.utils.paths import MissingInputsError, check_inputs


def test_a_named_data_root_that_does_not_exist_is_an_error_and_is_not_created(tmp_path, monkeypatch):
    missing = tmp_path / "typo"
    with pytest.raises(DataRootError, match=rf"^--data-root {missing}: no such directory \(nothing was created\)"):
        default_data_root(str(missing))
    monkeypatch.setenv("ATTN_DATA_ROOT", str(missing))
    with pytest.raises(DataRootError, match=r"^\$ATTN_DATA_ROOT=.*typo: no such directory"):
        default_data_root()
    (tmp_path / "file").write_text("")
    with pytest.raises(DataRootError, match="not a directory"):
        default_data_root(str(tmp_path / "file"))
    assert not missing.exists()


def test_check_inputs_names_every_missing_input_with_its_key_and_fix_in_one_line(tmp_path):
    (tmp_path / "vocab.txt").write_text("")
    inputs = [("data.vocab", tmp_path / "vocab.txt", "get BERT's"),
              ("data.questions", tmp_path / "q.json", "download VQA v2"),
              ("model.pretrained", tmp_path / "weights" / "config.json", "huggingface-cli download"),
              ("data.annotations", tmp_path / "a.json", "download VQA v2"),
              ("model.answer_table", None, "not needed")]
    with pytest.raises(MissingInputsError) as err:
        check_inputs(inputs)
    assert str(err.value) == (f"{tmp_path / 'q.json'} (data.questions), {tmp_path / 'a.json'} (data.annotations) do "
                              f"not exist: download VQA v2; {tmp_path / 'weights' / 'config.json'} (model.pretrained) "
                              f"does not exist: huggingface-cli download")
    check_inputs(inputs[:1] + inputs[-1:])  # all there: nothing raised


def test_existing_roots_and_the_cache_default(tmp_path, monkeypatch):
    assert default_data_root(str(tmp_path)) == tmp_path
    monkeypatch.delenv("ATTN_DATA_ROOT", raising=False)
    monkeypatch.setenv("ATTN_CACHE_DIR", str(tmp_path / "cache"))
    assert default_data_root() == tmp_path / "cache" / "data"


def test_graphattn_train_with_a_mistyped_data_root_creates_nothing(tmp_path, capsys):
    from graphattn import train

    assert train.main(["--data-root", str(tmp_path / "typo"), "--out", str(tmp_path / "run"), "--seeds", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --data-root {tmp_path / 'typo'}: no such directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
