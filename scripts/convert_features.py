"""Convert bottom-up region features into the suite's HDF5 store (``common.features``).

    python scripts/convert_features.py bottom-up-tsv  trainval_36/*.tsv                     --output coco_36.h5
    python scripts/convert_features.py lxmert-tsv     train2014_obj36.tsv val2014_obj36.tsv --output coco_obj36.h5
    python scripts/convert_features.py selfcritical-npz --att-dir cocobu_att --box-dir cocobu_box \\
                                       --image-info captions_train2014.json captions_val2014.json --output cocobu.h5
    python scripts/convert_features.py mcan-npz       train2014 val2014 test2015            --output mcan.h5

Options: ``--dtype float16|float32`` (storage; float16 halves the size), ``--feature-dim``
(2048), ``--quiet`` (no progress bar). Re-running the same command resumes an interrupted
conversion: images already in the output are skipped. The inputs' layouts are described
in ``common/features/formats/__init__.py``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.features import RegionFeatureError  # noqa: E402
from common.features.convert import convert  # noqa: E402
from common.features.formats import bottom_up_tsv, lxmert_tsv, mcan_npz, selfcritical_npz  # noqa: E402


def _chain(module, paths):
    """A reader over several inputs of one format, in the order given."""
    def read(skip):
        for path in paths:
            yield from module.read(path, skip=skip)
    return read


def reader_and_total(args: argparse.Namespace):
    if args.format == "bottom-up-tsv":
        return _chain(bottom_up_tsv, args.inputs), None
    if args.format == "lxmert-tsv":
        return _chain(lxmert_tsv, args.inputs), None
    if args.format == "mcan-npz":
        return _chain(mcan_npz, args.inputs), sum(mcan_npz.count(path) for path in args.inputs)
    sizes = {}
    for path in args.image_info:
        sizes.update(selfcritical_npz.load_image_sizes(path))
    return (lambda skip: selfcritical_npz.read(args.att_dir, args.box_dir, sizes, skip=skip),
            selfcritical_npz.count(args.att_dir))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--output", required=True, type=Path, help="HDF5 file to create or resume")
    common.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    common.add_argument("--feature-dim", type=int, default=2048)
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, what in (("bottom-up-tsv", "Anderson et al.'s TSV files"), ("lxmert-tsv", "LXMERT *_obj36.tsv files"),
                       ("mcan-npz", "directories of MCAN COCO_<split>_<id>.jpg.npz files")):
        sub = formats.add_parser(name, parents=[common], help=what)
        sub.add_argument("inputs", nargs="+", type=Path, help=what)
    sub = formats.add_parser("selfcritical-npz", parents=[common], help="self-critical.pytorch cocobu_att/cocobu_box")
    sub.add_argument("--att-dir", required=True, type=Path, help="cocobu_att: <id>.npz with 'feat'")
    sub.add_argument("--box-dir", required=True, type=Path, help="cocobu_box: <id>.npy boxes")
    sub.add_argument("--image-info", required=True, type=Path, nargs="+",
                     help="JSON(s) with images: [{id, width, height}] (COCO annotation files, or cocotalk.json)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        read, total = reader_and_total(args)
        counts = convert(read, args.output, feature_dim=args.feature_dim, dtype=args.dtype, total=total,
                         progress=not args.quiet)
    except RegionFeatureError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"output": str(args.output), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
