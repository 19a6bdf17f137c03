"""Extract bottom-up region features from images with detectron2, into the HDF5 store.

    python scripts/extract_features.py val2014/ --output coco_val2014_adaptive.h5 \\
        --config-file faster_rcnn_R_101_C4_attr_caffemaxpool.yaml --weights faster_rcnn_from_caffe_attr.pkl \\
        [--min-boxes 10 --max-boxes 100 | --min-boxes 36 --max-boxes 36] [--conf-thresh 0.2] [--nms-thresh 0.3] \\
        [--device cuda] [--dtype float16] [--append | --overwrite] [--opts KEY VALUE ...]

Inputs are image files or directories of them; an image's id is ``names.numeric_id`` of its
file name (COCO_val2014_000000273052.jpg -> 273052; see docs/features.md). Region selection
is Anderson et al.'s (``common/features/extract.py``). The output is built in
``<output>.partial`` and renamed when every image is done; re-running the same command
resumes it (images already stored are skipped), and does nothing when the output is complete,
written with the same options from the same inputs. An existing output is otherwise refused,
naming what differs: ``--append`` adds these images to it (same options only), ``--overwrite``
builds a new one and renames it over the old, which stays whole until then. Errors exit with 2.
Needs detectron2 (not on PyPI; the error says how to install it) and, in practice, a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path, help="image files or directories")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--config-file", required=True, help="detectron2 config of a C4 Faster R-CNN")
    parser.add_argument("--weights", required=True, help="its weights (.pkl or .pth)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--min-boxes", type=int, default=10)
    parser.add_argument("--max-boxes", type=int, default=100)
    parser.add_argument("--conf-thresh", type=float, default=0.2)
    parser.add_argument("--nms-thresh", type=float, default=0.3)
    parser.add_argument("--feature-dim", type=int, default=2048)
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--append", action="store_true", help="add these images to an existing output")
    existing.add_argument("--overwrite", action="store_true",
                          help="rebuild an existing output from these images (it is replaced once the new one is "
                               "complete)")
    parser.add_argument("--opts", nargs="*", default=[], help="detectron2 config overrides: KEY VALUE ...")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # common.features (h5py, torch) only once the command line is parsed: --help and a bad option answer at once
    from common.features import RegionFeatureError
    from common.features.extract import Selection, extract, image_files, image_sources
    from common.utils import console

    try:
        selection = Selection(args.min_boxes, args.max_boxes, args.conf_thresh, args.nms_thresh)
        images = image_files(args.inputs)
        sources = image_sources(args.inputs)
        from common.features.detectron2_detector import Detectron2Detector
        detector = Detectron2Detector(args.config_file, args.weights, device=args.device, opts=args.opts)
        counts = extract(images, detector, args.output, selection, feature_dim=args.feature_dim, dtype=args.dtype,
                         progress=not args.quiet, append=args.append, overwrite=args.overwrite, sources=sources)
    except (RegionFeatureError, ImportError, ValueError) as err:
        return console.fail(err)
    print(json.dumps({"output": str(args.output), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
