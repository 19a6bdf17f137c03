"""Planetoid loading: clear errors for missing/corrupt raw files, the public split on real data."""
import pytest
import torch

from graphattn import train
from graphattn.data import PlanetoidDataError, load_planetoid, raw_file_names


def test_incomplete_raw_dir_names_missing_and_corrupt_files(tmp_path):
    raw = tmp_path / "planetoid" / "Cora" / "raw"
    raw.mkdir(parents=True)
    names = raw_file_names("cora")
    for name in names[1:]:
        (raw / name).write_bytes(b"not a pickle")
    with pytest.raises(PlanetoidDataError) as err:
        load_planetoid("cora", str(tmp_path))
    message = str(err.value)
    assert f"missing {names[0]}" in message and str(raw / names[0]) in message
    assert f"corrupt {names[1]}" in message
    assert "kimiyoung/planetoid" in message


def test_an_empty_or_blank_raw_file_is_named_as_such_with_the_fix(tmp_path):
    raw = tmp_path / "planetoid" / "Cora" / "raw"
    raw.mkdir(parents=True)
    (raw / "ind.cora.x").write_bytes(b"")
    (raw / "ind.cora.y").write_bytes(b"\n \n\n")
    with pytest.raises(PlanetoidDataError) as err:
        load_planetoid("cora", str(tmp_path))
    lines = str(err.value).splitlines()
    assert f"  empty ind.cora.x at {raw / 'ind.cora.x'}: the file is empty; expected 22,119 bytes with sha256 " \
           f"23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab" in lines
    assert f"  empty ind.cora.y at {raw / 'ind.cora.y'}: the file holds only blank lines; expected 4,054 bytes with " \
           f"sha256 94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1" in lines
    assert lines[-1].startswith("The files are published in github.com/kimiyoung/planetoid (data/), e.g. "
                                "https://github.com/kimiyoung/planetoid/raw/master/data/ind.cora.x; put them in ")


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(ValueError, match="CiteSeer"):
        load_planetoid("reddit", "/nonexistent")


@pytest.mark.realdata
def test_pubmed_without_allx_is_a_clear_error_not_a_download(attn_data_root):
    raw = attn_data_root / "planetoid" / "PubMed" / "raw"
    if (raw / "ind.pubmed.allx").exists():
        pytest.skip("this data root has the complete PubMed")
    with pytest.raises(PlanetoidDataError) as err:
        load_planetoid("PubMed", str(attn_data_root))
    message = str(err.value)
    assert "ind.pubmed.allx" in message and str(raw / "ind.pubmed.allx") in message
    assert "508e538e2abdccdd54c4d3e9f49d638b4af7107d85845f66ddea5a5152658b7e" in message
    assert "github.com/kimiyoung/planetoid" in message


@pytest.mark.realdata
def test_train_cli_reports_missing_pubmed_file_with_exit_code_2(attn_data_root, tmp_path, capsys):
    if (attn_data_root / "planetoid" / "PubMed" / "raw" / "ind.pubmed.allx").exists():
        pytest.skip("this data root has the complete PubMed")
    code = train.main(["--dataset", "PubMed", "--data-root", str(attn_data_root), "--out", str(tmp_path)])
    assert code == 2
    assert "missing ind.pubmed.allx" in capsys.readouterr().err


@pytest.mark.realdata
@pytest.mark.parametrize("name,nodes,features,classes,train_nodes", [
    ("Cora", 2708, 1433, 7, 140), ("CiteSeer", 3327, 3703, 6, 120),
])
def test_public_split_with_row_normalised_features(attn_data_root, name, nodes, features, classes, train_nodes):
    before = sorted(p.name for p in (attn_data_root / "planetoid" / name).iterdir())
    data = load_planetoid(name, str(attn_data_root))
    assert data.x.shape == (nodes, features) and data.num_classes == classes
    assert int(data.train_mask.sum()) == train_nodes
    assert int(data.val_mask.sum()) == 500 and int(data.test_mask.sum()) == 1000
    row_sums = data.x.sum(1)
    nonzero = row_sums > 0
    torch.testing.assert_close(row_sums[nonzero], torch.ones(int(nonzero.sum())))
    assert sorted(p.name for p in (attn_data_root / "planetoid" / name).iterdir()) == before, \
        "loading must not write into the data root"
