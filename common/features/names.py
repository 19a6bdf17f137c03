"""The numeric id of a named image (LXMERT ``img_id``, MCAN or image file names).

The store indexes images by an int64 id; sources that name their images keep the name
too (``/image_names``). The mapping is one fixed function, so a name always gets the same
id and never shares it with a distinct image of the same dataset:

- ``COCO_<split>_<digits>`` (``COCO_val2014_000000273052``) -> the COCO image id (273052);
  COCO ids are unique across train2014, val2014 and test2015, so these stay distinct;
- a name of at most 18 digits (Visual Genome ``2410371``, Flickr30k ``1000092795``) -> that number;
- any other name (NLVR2 ``train-10171-0-img0``, GQA ``n161313``) -> a negative id from a
  64-bit BLAKE2b hash of its UTF-8 bytes: ``-(h >> 1) - 1``, in [-2**63, -1], never equal
  to a numeric id. Two names hashing alike are reported as a duplicate when written.

Images of different datasets can share a number (Visual Genome 42 and COCO 42): convert
such sources into separate stores (a shared store reports the clash as a duplicate id).
"""
from __future__ import annotations

import hashlib
import re

_COCO = re.compile(r"COCO_[A-Za-z]+[0-9]*_([0-9]{1,18})")
_NUMBER = re.compile(r"[0-9]{1,18}")


def numeric_id(name: str) -> int:
    """The store's int64 id of the image called ``name`` (see the module docstring)."""
    match = _COCO.fullmatch(name)
    if match:
        return int(match.group(1))
    if _NUMBER.fullmatch(name):
        return int(name)
    digest = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "big")
    return -(digest >> 1) - 1
