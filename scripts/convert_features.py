"""Convert bottom-up region features into the suite's HDF5 store (``common.features``).

    python scripts/convert_features.py bottom-up-tsv  trainval_36/*.tsv                     --output coco_36.h5
    python scripts/convert_features.py lxmert-tsv     train2014_obj36.tsv val2014_obj36.tsv --output coco_obj36.h5
    python scripts/convert_features.py selfcritical-npz --att-dir cocobu_att --box-dir cocobu_box \\
                                       --image-info captions_train2014.json captions_val2014.json --output cocobu.h5
    python scripts/convert_features.py mcan-npz       train2014 val2014 test2015            --output mcan.h5
    python scripts/convert_features.py mark-complete  old_store.h5     # a store of layout version 1 known to be whole

Options: ``--dtype float16|float32`` (storage; float16 halves the size), ``--feature-dim``
(2048), ``--append`` (add these inputs to an existing store), ``--quiet`` (no progress bar).

The output is built in ``<output>.partial`` and renamed to ``<output>`` only when every
input is converted, so a file under the output's name is always complete. Re-running the
same command resumes an interrupted conversion from the partial file (images already
stored are skipped), and does nothing when the output is already complete. An existing
output is refused without ``--append``; with it, the store is copied to the partial file,
extended and renamed back, so the original stays whole until then. The inputs' layouts are
described in ``common/features/formats/__init__.py``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.features import RegionFeatureError  # noqa: E402
from common.features.convert import convert  # noqa: E402
from common.features.formats import bottom_up_tsv, lxmert_tsv, mcan_npz, selfcritical_npz  # noqa: E402
from common.features.layout import partial_path  # noqa: E402
from common.features.sources import check_distinct  # noqa: E402
from common.features.writer import mark_complete  # noqa: E402

MODULES = {"bottom-up-tsv": bottom_up_tsv, "lxmert-tsv": lxmert_tsv, "mcan-npz": mcan_npz}


def inputs(args: argparse.Namespace):
    """(sources, entries, total) of the command's inputs, every input checked before any output exists."""
    if args.format == "selfcritical-npz":
        sources = selfcritical_npz.sources(args.att_dir, args.box_dir, args.image_info)
        check_distinct(sources)
        sizes = {}
        for path in args.image_info:
            sizes.update(selfcritical_npz.load_image_sizes(path))
        return sources, selfcritical_npz.entries(args.att_dir, args.box_dir, sizes, args.feature_dim), \
            sources[0]["files"]
    module = MODULES[args.format]
    sources = [module.source(path) for path in args.inputs]
    check_distinct(sources)
    entries = itertools.chain.from_iterable(module.entries(path, args.feature_dim) for path in args.inputs)
    total = sum(source["files"] for source in sources) if module is mcan_npz else None
    return sources, entries, total


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--output", required=True, type=Path, help="HDF5 file to create (built in <output>.partial)")
    common.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    common.add_argument("--feature-dim", type=int, default=2048)
    common.add_argument("--append", action="store_true",
                        help="add these inputs to an existing output (copied, extended, then renamed back)")
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
    sub = formats.add_parser("mark-complete", help="mark stores of layout version 1 (which recorded no "
                                                   "completeness) complete, on your word that they are whole")
    sub.add_argument("stores", nargs="+", type=Path)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.format == "mark-complete":
            print(json.dumps({"marked_complete": {str(path): mark_complete(path) for path in args.stores}}))
            return 0
        sources, entries, total = inputs(args)
        counts = convert(entries, args.output, sources, feature_dim=args.feature_dim, dtype=args.dtype, total=total,
                         progress=not args.quiet, append=args.append)
    except RegionFeatureError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        partial = partial_path(args.output) if args.format != "mark-complete" else None
        kept = f"the work so far is in {partial}; " if partial and partial.exists() else ""
        print(f"interrupted: {kept}re-run the same command to resume", file=sys.stderr)
        return 130
    print(json.dumps({"output": str(args.output), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
