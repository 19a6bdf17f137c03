"""Sizes of the tiny MCAN the tests train (MCAN-small's shape, scaled down)."""
TINY = dict(feature_dim=16, word_dim=16, hidden=32, heads=4, ffn=64, layers=2, flat_mlp=32, flat_out=64)
