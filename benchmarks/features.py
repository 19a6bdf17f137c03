"""Region-feature store: random-access read throughput (images/s), writing, file size.

    python benchmarks/features.py [--images 4000] [--regions 36 | --regions 10 100] [--dim 2048] [--dtype float16]
                                  [--chunk-rows 36] [--workers 1 2] [--batch-size 32] [--quick] [--device cuda]

Writes ``--images`` synthetic images of ``--regions`` x ``--dim`` features into a temporary
HDF5 file with ``RegionFeatureWriter`` (one file per ``--chunk-rows`` value), then reads
every image once in a random order:

- ``direct``: ``store[image_id]`` in this process, twice: with the file's pages in the OS
  page cache (just written: ``warm``) and after evicting them with
  ``posix_fadvise(DONTNEED)`` (``cold``, as on a first epoch over a file bigger than RAM;
  how cold depends on the disk).
- ``dataloader``: a ``DataLoader`` over a ``RandomSampler`` with ``pad_regions`` as collate,
  for each ``--workers`` count and store output dtype (``--loader-dtypes``: float32, or the
  stored float16, which halves the batch that workers send through shared memory), cold
  cache; ``images_per_s`` counts the images after the first batch over the time after it
  (steady state), ``with_startup`` the whole pass. With ``--device cuda`` every batch is also
  copied to the GPU as the trainers do (pinned by the loader, non-blocking copy, synchronised).

Target (issue 6): >= 2,000 random-access images/s for 36 x 2048 float16. Results go to
``benchmarks/results/<--name>.json`` (default ``features.json``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measure import environment, write_json  # noqa: E402
from common.features import RegionFeatureStore, RegionFeatureWriter, pad_regions  # noqa: E402
from common.utils.runtime import Runtime  # noqa: E402

TARGET_IMAGES_PER_S = 2000
DTYPES = {"float32": torch.float32, "float16": torch.float16}


class _ByIndex(Dataset):
    def __init__(self, store: RegionFeatureStore):
        self.store, self.ids = store, store.image_ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int):
        return self.store[self.ids[index]]


def evict_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def write_file(path: Path, args) -> dict:
    rng = np.random.default_rng(0)
    low, high = args.regions[0], args.regions[-1]
    counts = rng.integers(low, high + 1, size=args.images)
    block = rng.uniform(0, 8, size=(high * 16, args.dim)).astype(np.float32)
    boxes = np.tile(np.array([[0, 0, 10, 10]], dtype=np.float32), (high, 1))
    start = time.perf_counter()
    with RegionFeatureWriter(path, feature_dim=args.dim, dtype=args.dtype, chunk_rows=args.chunk_rows_now) as writer:
        for image_id, count in enumerate(counts):
            offset = (image_id * 7) % (len(block) - count)
            writer.add(image_id, block[offset:offset + count], boxes[:count], 480, 640)
    seconds = time.perf_counter() - start
    return {"images_per_s": args.images / seconds, "seconds": seconds, "file_mb": path.stat().st_size / 2**20,
            "bytes_per_image": path.stat().st_size / args.images}


def direct_reads(path: Path, order: np.ndarray, cold: bool) -> dict:
    if cold:
        evict_from_page_cache(path)
    with RegionFeatureStore(path) as store:
        start = time.perf_counter()
        for image_id in order:
            store[int(image_id)]
        seconds = time.perf_counter() - start
    return {"images_per_s": len(order) / seconds, "seconds": seconds}


def loader_reads(path: Path, workers: int, batch_size: int, dtype: torch.dtype, runtime: Runtime) -> dict:
    evict_from_page_cache(path)
    store = RegionFeatureStore(path, dtype=dtype)
    loader = DataLoader(_ByIndex(store), batch_size=batch_size, num_workers=workers, collate_fn=pad_regions,
                        sampler=RandomSampler(range(len(store)), generator=torch.Generator().manual_seed(0)),
                        pin_memory=runtime.pin_memory)

    def images(batch) -> int:  # on the device, as a trainer receives it
        return runtime.to_device(batch)[0].shape[0]

    start = time.perf_counter()
    iterator = iter(loader)
    first = images(next(iterator))
    runtime.synchronize()
    after_first = time.perf_counter()
    rest = sum(images(batch) for batch in iterator)
    runtime.synchronize()
    end = time.perf_counter()
    return {"images_per_s": rest / (end - after_first), "with_startup": (first + rest) / (end - start),
            "seconds": end - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--regions", type=int, nargs="+", default=[36],
                        help="regions per image, or MIN MAX for a uniform count in that range (e.g. 10 100)")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    parser.add_argument("--chunk-rows", type=int, nargs="+", default=[36])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--loader-dtypes", nargs="+", default=["float32", "float16"], choices=sorted(DTYPES),
                        help="the store's output dtype in the DataLoader runs")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary HDF5 files go")
    parser.add_argument("--quick", action="store_true", help="400 images (smoke run)")
    parser.add_argument("--device", default="cpu", help="cpu (default; batches stay in memory), cuda or cuda:N")
    parser.add_argument("--name", default="features", help="results/<name>.json")
    args = parser.parse_args()
    runtime = Runtime.create(args.device)
    if args.quick:
        args.images = 400
    if len(args.regions) > 2 or args.regions[0] > args.regions[-1]:
        parser.error("--regions takes a count or MIN MAX with MIN <= MAX")
    report = {"environment": environment(torch.get_num_threads()) | runtime.describe(),
              "target_images_per_s": TARGET_IMAGES_PER_S,
              "shape": {"images": args.images, "regions": args.regions, "dim": args.dim, "dtype": args.dtype},
              "batch_size": args.batch_size, "load_average_before": os.getloadavg(), "runs": []}
    order = np.random.default_rng(1).permutation(args.images)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for chunk_rows in args.chunk_rows:
            args.chunk_rows_now = chunk_rows
            path = Path(tmp) / f"features_{chunk_rows}.h5"
            run = {"chunk_rows": chunk_rows, "write": write_file(path, args),
                   "direct_warm": direct_reads(path, order, cold=False),
                   "direct_cold": direct_reads(path, order, cold=True),
                   "dataloader": {f"{w}_workers_{name}": loader_reads(path, w, args.batch_size, DTYPES[name], runtime)
                                  for name in args.loader_dtypes for w in args.workers}}
            report["runs"].append(run)
            loader = ", ".join(f"{key} {r['images_per_s']:.0f}" for key, r in run["dataloader"].items())
            print(f"chunk_rows={chunk_rows}: write {run['write']['images_per_s']:.0f} img/s, "
                  f"{run['write']['bytes_per_image'] / 1024:.0f} KiB/img; random reads img/s: direct warm "
                  f"{run['direct_warm']['images_per_s']:.0f}, cold {run['direct_cold']['images_per_s']:.0f}; "
                  f"DataLoader {loader}")
            path.unlink()
    report["load_average_after"] = os.getloadavg()  # other processes on the machine slow every number
    print("wrote", write_json(args.name, report))


if __name__ == "__main__":
    main()
