"""Readers (and, for fixtures, writers) of the region-feature formats users already have.

Every reader yields ``RegionFeatures`` (float32 features, pixel boxes, image size) and takes
``skip(image_id) -> bool``: records it skips are not decoded, so a resumed conversion
passes over the images already stored at little cost.

| name | files | written by |
|---|---|---|
| ``bottom-up-tsv`` | ``*.tsv``: image_id, image_w, image_h, num_boxes, boxes, features (base64 float32) | Anderson et al. ``tools/generate_tsv.py`` (``trainval_36``, adaptive 10-100) |
| ``lxmert-tsv`` | ``*_obj36.tsv``: img_id, img_h, img_w, objects_id, objects_conf, attrs_id, attrs_conf, num_boxes, boxes, features | LXMERT (``utils.py: load_obj_tsv`` reads it) |
| ``selfcritical-npz`` | ``cocobu_att/<id>.npz`` (``feat`` [N, 2048]) + ``cocobu_box/<id>.npy`` [N, 4], image sizes from a JSON | self-critical.pytorch ``scripts/make_bu_data.py`` |
| ``mcan-npz`` | ``COCO_<split>_<id:012d>.jpg.npz``: ``x`` [2048, N], ``bbox`` [N, 4], ``image_h``, ``image_w`` | MCAN's bottom-up features |
"""
from . import bottom_up_tsv, lxmert_tsv, mcan_npz, selfcritical_npz

__all__ = ["bottom_up_tsv", "lxmert_tsv", "mcan_npz", "selfcritical_npz"]
