"""Region features (bottom-up detector outputs) shared by the multimodal domains.

One HDF5 file holds the ragged regions of many images (``layout.py``); write it with
``RegionFeatureWriter`` (built in ``<path>.partial``, published whole), read it lazily with
``RegionFeatureStore`` (which opens only complete files), batch with ``pad_regions``.
``names.numeric_id`` maps image names to ids; ``fixtures`` makes deterministic synthetic
features for tests.
"""
from .names import numeric_id
from .padding import pad_regions
from .store import MissingImageError, RegionFeatureError, RegionFeatures, RegionFeatureStore
from .writer import RegionFeatureWriter

__all__ = ["MissingImageError", "RegionFeatureError", "RegionFeatureStore", "RegionFeatureWriter", "RegionFeatures",
           "numeric_id", "pad_regions"]
