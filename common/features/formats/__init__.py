"""Readers (and, for fixtures, writers) of the region-feature formats users already have.

Every module has ``source(path)`` (or ``sources(...)``), which checks an input and returns
the record a store keeps of it (a missing, empty or wrong-kind path is an error before any
output exists), and ``entries(path, feature_dim)``, which yields an ``Entry`` per image: its
id, its place (file and line, or .npz file), its name if the source names images, and
``load()``, which decodes it into ``RegionFeatures`` (float32 features, pixel boxes, image
size). Entries are not decoded until loaded, so a resumed conversion passes over the
images already stored at little cost. Decoding errors name the file, the line (or .npz
file) and the field. The TSV readers take plain, gzipped or zip-member files and streams
(a FIFO, a pipe, ``-`` for stdin), each read once from its start (``sources.text_input``).

- ``bottom_up_tsv``: Anderson et al.'s ``tools/generate_tsv.py`` output (``trainval_36``,
  adaptive 10-100): image_id, image_w, image_h, num_boxes, boxes, features (base64 float32).
- ``lxmert_tsv``: LXMERT's ``*_obj36.tsv`` (read by its ``utils.py: load_obj_tsv``): img_id,
  img_h, img_w, objects_id, objects_conf, attrs_id, attrs_conf, num_boxes, boxes, features;
  ``img_id`` is kept as the image's name (``names.py`` maps it to the numeric id).
- ``selfcritical_npz``: self-critical.pytorch's ``scripts/make_bu_data.py`` output:
  ``cocobu_att/<id>.npz`` (``feat`` [N, 2048]) + ``cocobu_box/<id>.npy`` [N, 4]; image
  sizes from a JSON.
- ``mcan_npz``: MCAN's ``COCO_<split>_<id:012d>.jpg.npz``: ``x`` [2048, N], ``bbox`` [N, 4],
  ``image_h``, ``image_w``.
"""
from . import bottom_up_tsv, lxmert_tsv, mcan_npz, selfcritical_npz

__all__ = ["bottom_up_tsv", "lxmert_tsv", "mcan_npz", "selfcritical_npz"]
