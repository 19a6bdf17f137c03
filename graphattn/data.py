"""Planetoid citation graphs (Yang, Cohen & Salakhutdinov, ICML 2016) with the public split.

Layout: ``<data_root>/planetoid/<Cora|CiteSeer|PubMed>/raw/ind.<name>.<suffix>``, the layout of
``torch_geometric.datasets.Planetoid``. Raw files are checked (presence, size, sha256) before
PyG touches them, so a missing or corrupt file gives an error naming the file, the expected
path and where it is published instead of a failed download or an unpickling stack trace.
The data root is only written to when PyG downloads missing raw files; PyG's ``processed/``
directory always goes to the user cache (:func:`common.utils.cache_dir`), so a read-only shared
data root works.
"""
from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path
from typing import Optional

from torch_geometric.data import Data
from torch_geometric.datasets import Planetoid
from torch_geometric.transforms import NormalizeFeatures

from common.utils import cache_dir, default_data_root
from common.utils.inputs import blank_content

from .config import canonical_name

RAW_SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
SOURCE_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"

#: Bytes and sha256 of every raw file, as published in kimiyoung/planetoid (commit af6abf46).
RAW_CHECKSUMS = {
    'ind.citeseer.allx': (595021, '2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668'),
    'ind.citeseer.ally': (55623, 'f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95'),
    'ind.citeseer.graph': (61987, 'd79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7'),
    'ind.citeseer.test.index': (5000, '2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4'),
    'ind.citeseer.tx': (260321, '539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21'),
    'ind.citeseer.ty': (24135, '55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce'),
    'ind.citeseer.x': (31087, 'd20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6'),
    'ind.citeseer.y': (3014, '8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924'),
    'ind.cora.allx': (257305, '9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543'),
    'ind.cora.ally': (47959, '2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71'),
    'ind.cora.graph': (59847, '58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d'),
    'ind.cora.test.index': (5000, '297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875'),
    'ind.cora.tx': (148025, 'b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a'),
    'ind.cora.ty': (28135, '41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad'),
    'ind.cora.x': (22119, '23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab'),
    'ind.cora.y': (4054, '94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1'),
    'ind.pubmed.allx': (7578385, '508e538e2abdccdd54c4d3e9f49d638b4af7107d85845f66ddea5a5152658b7e'),
    'ind.pubmed.ally': (224739, '0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e'),
    'ind.pubmed.graph': (471808, '5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9'),
    'ind.pubmed.test.index': (6000, 'b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5'),
    'ind.pubmed.tx': (405505, '4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d'),
    'ind.pubmed.ty': (12135, 'ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd'),
    'ind.pubmed.x': (23172, 'fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33'),
    'ind.pubmed.y': (854, 'e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3'),
}


class PlanetoidDataError(FileNotFoundError):
    """A Planetoid raw file is missing or corrupt; the message says which and how to fix it."""


def raw_file_names(name: str) -> list[str]:
    return [f"ind.{canonical_name(name).lower()}.{suffix}" for suffix in RAW_SUFFIXES]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_raw_files(raw_dir: Path, name: str) -> None:
    """Raise :class:`PlanetoidDataError` listing every missing or corrupt raw file of ``name``."""
    problems = []
    for file in raw_file_names(name):
        path = raw_dir / file
        size, sha = RAW_CHECKSUMS[file]
        if not path.is_file():
            problems.append(f"  missing {file}: expected at {path} ({size:,} bytes, sha256 {sha})")
        elif blank := blank_content(path):
            problems.append(f"  empty {file} at {path}: {blank}; expected {size:,} bytes with sha256 {sha}")
        elif path.stat().st_size != size or _sha256(path) != sha:
            problems.append(f"  corrupt {file} at {path}: expected {size:,} bytes with sha256 {sha}, "
                            f"found {path.stat().st_size:,} bytes")
    if problems:
        raise PlanetoidDataError(
            f"Planetoid {canonical_name(name)} is incomplete in {raw_dir}:\n" + "\n".join(problems) +
            f"\nThe files are published in github.com/kimiyoung/planetoid (data/), e.g. "
            f"{SOURCE_URL}/{problems[0].split()[1].rstrip(':')}; put them in {raw_dir} "
            f"or point --data-root (or ATTN_DATA_ROOT) at a complete copy."
        )


class _Planetoid(Planetoid):
    """PyG's ``Planetoid`` with the raw and processed directories chosen separately."""

    def __init__(self, root: str, name: str, raw_dir: Path, processed_dir: Path):
        self._raw_dir, self._processed_dir = str(raw_dir), str(processed_dir)
        super().__init__(root, name, split="public")

    @property
    def raw_dir(self) -> str:
        return self._raw_dir

    @property
    def processed_dir(self) -> str:
        return self._processed_dir


def load_planetoid(name: str, data_root: Optional[str] = None, download: bool = True) -> Data:
    """The public split of ``name`` with row-normalised features (``T.NormalizeFeatures``).

    Looks in ``<data_root>/planetoid/<Name>/raw`` (``data_root`` defaults to ``ATTN_DATA_ROOT``,
    else the user cache). If that directory does not exist and ``download`` is true, PyG
    downloads the files there; an existing but incomplete directory raises
    :class:`PlanetoidDataError` naming the missing files. The returned ``Data`` has
    ``x``, ``edge_index``, ``y``, ``train_mask``/``val_mask``/``test_mask`` and ``num_classes``.
    """
    name = canonical_name(name)
    root = default_data_root(data_root) / "planetoid"
    dataset_dir = root / name
    raw_dir = dataset_dir / "raw"
    downloading = not raw_dir.is_dir()
    if not downloading:
        check_raw_files(raw_dir, name)
    elif not download:
        raise PlanetoidDataError(f"no Planetoid {name} under {raw_dir}; download the raw files from "
                                 f"github.com/kimiyoung/planetoid (data/) or pass download=True")
    # Processed tensors are a derived cache: never written into the (possibly shared) data root.
    processed_dir = cache_dir() / "planetoid" / name / "processed"
    try:
        dataset = _Planetoid(str(root), name, raw_dir, processed_dir)
    except (urllib.error.URLError, OSError) as err:
        if raw_dir.is_dir() and all((raw_dir / f).is_file() for f in raw_file_names(name)):
            raise
        raise PlanetoidDataError(
            f"could not download Planetoid {name} into {raw_dir} ({err}); copy the raw files "
            f"from github.com/kimiyoung/planetoid (data/) there by hand"
        ) from err
    if downloading:
        check_raw_files(raw_dir, name)
    data = NormalizeFeatures()(dataset[0])
    data.num_classes = dataset.num_classes
    return data


def load_dataset(name: str, data_root: Optional[str] = None) -> Data:
    """A Planetoid graph (:func:`load_planetoid`) or, for ``demo``, the synthetic graph of
    :func:`graphattn.fixtures.demo_graph` (nothing to download)."""
    if canonical_name(name) == "Demo":
        from .fixtures import demo_graph

        return demo_graph()
    return load_planetoid(name, data_root)
