"""FLOPs counted per configuration match the matrix-product count of the layers."""
from __future__ import annotations

from vqa.lxmert import Adaptation, LayerDropOptions, build_vqa_model
from vqa.lxmert.flops import count_flops, dummy_inputs, flops_report

from .helpers import tiny_config

WORDS, REGIONS = 7, 11


def attention_flops(queries: int, keys: int, h: int) -> int:
    """q and output projections on the queries, k and v on the keys, q k^T and weights v."""
    return 4 * queries * h * h + 4 * keys * h * h + 4 * queries * keys * h


def ffn_flops(n: int, h: int, inner: int) -> int:
    return 4 * n * h * inner


def test_pruning_removes_the_flops_of_exactly_the_dropped_layers():
    config = tiny_config(l_layers=2, r_layers=2, x_layers=2)
    model = build_vqa_model(config, 5, Adaptation())
    inputs = dummy_inputs(config, batch=1, words=WORDS, regions=REGIONS)
    full = count_flops(model, inputs)
    pruned = count_flops(model, inputs, LayerDropOptions(language=1, vision=1, cross=1))
    h, inner, L, N = config.hidden_size, config.intermediate_size, WORDS, REGIONS
    language = attention_flops(L, L, h) + ffn_flops(L, h, inner)
    vision = attention_flops(N, N, h) + ffn_flops(N, h, inner)
    cross = attention_flops(L, N, h) + attention_flops(N, L, h) + language + vision
    assert full - pruned == language + vision + cross


def test_adaptive_variants_cost_the_same_matrix_products():
    config = tiny_config()
    inputs = dummy_inputs(config, words=WORDS, regions=REGIONS)
    counts = {name: count_flops(build_vqa_model(config, 5, Adaptation.from_dict(options)), inputs)
              for name, options in {"softmax": {}, "span": {"span": {}}, "entmax": {"normalizer": "entmax"},
                                    "bam": {"normalizer": "bam-lf"}}.items()}
    assert len(set(counts.values())) == 1


def test_report_on_the_955_layout_removes_about_the_papers_share():
    report = flops_report(tiny_config(l_layers=9, r_layers=5, x_layers=5, hidden_size=64, num_attention_heads=4,
                                      intermediate_size=256), LayerDropOptions(language=1, vision=1, cross=1))
    assert (report["layers"], report["pruned_layers"]) == ("9-5-5", "8-4-4")
    assert 15 < report["reduction_percent"] < 19          # the paper: 17.54% at hidden 768


def test_cli_writes_nothing_unless_asked(tmp_path, monkeypatch, capsys):
    import json

    from vqa.lxmert import flops

    monkeypatch.setattr(flops, "pretrained_shape", lambda: tiny_config(l_layers=2, r_layers=2, x_layers=2))
    monkeypatch.chdir(tmp_path)
    assert flops.main([]) == 0
    assert "GFLOPs" in capsys.readouterr().out and list(tmp_path.iterdir()) == []
    assert flops.main(["--out", "flops.json"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["files written:", "  flops.json"]
    assert json.loads((tmp_path / "flops.json").read_text())["layers"] == "2-2-2"
