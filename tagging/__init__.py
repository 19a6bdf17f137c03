"""Part-of-speech tagging with self-attention networks on Universal Dependencies (Dufter, Schmitt &
Schütze, COLING 2020): direct position interactions, learnable temperature and convoluted attention,
and any normalizer of :mod:`common.attention`. See docs/tagging.md."""
from common.lazy import lazy_exports

_EXPORTS = {"Tagger": "model", "VARIANTS": "model", "load_treebank": "data", "read_conllu": "data",
            "accuracies": "metrics"}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
