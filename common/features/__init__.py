"""Region features (bottom-up detector outputs) shared by the multimodal domains.

One HDF5 file holds the ragged regions of many images (``layout.py``); write it with
``RegionFeatureWriter``, read it lazily with ``RegionFeatureStore``, batch with
``pad_regions``. ``fixtures`` makes deterministic synthetic features for tests.
"""
from .padding import pad_regions
from .store import MissingImageError, RegionFeatureError, RegionFeatures, RegionFeatureStore
from .writer import RegionFeatureWriter

__all__ = ["MissingImageError", "RegionFeatureError", "RegionFeatureStore", "RegionFeatureWriter", "RegionFeatures",
           "pad_regions"]
