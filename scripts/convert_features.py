"""Convert bottom-up region features into the suite's HDF5 store (``common.features``).

    python scripts/convert_features.py bottom-up-tsv  trainval_36/*.tsv                     --output coco_36.h5
    python scripts/convert_features.py bottom-up-tsv  trainval_36.zip                       --output coco_36.h5
    python scripts/convert_features.py bottom-up-tsv  <(unzip -p trainval.zip)             --output coco_adaptive.h5
    python scripts/convert_features.py lxmert-tsv     train2014_obj36.tsv val2014_obj36.tsv --output coco_obj36.h5
    python scripts/convert_features.py selfcritical-npz --att-dir cocobu_att --box-dir cocobu_box \\
                                       --image-info captions_train2014.json captions_val2014.json --output cocobu.h5
    python scripts/convert_features.py mcan-npz       train2014 val2014 test2015            --output mcan.h5
    python scripts/convert_features.py mark-complete  old_store.h5     # a store of layout version 1 known to be whole

Options: ``--dtype float16|float32`` (storage; float16 halves the size), ``--feature-dim``
(2048), ``--append`` (add these inputs to an existing store), ``--overwrite`` (rebuild an
existing store from these inputs), ``--member NAME`` (the file to read in a .zip holding
several), ``--quiet`` (no progress).

TSV inputs may be files, ``.tsv.gz`` or ``.zip`` files (read without unpacking), or streams
read once: a FIFO, a pipe (``-`` for stdin) or a process substitution ``<(zcat a.tsv.gz)``.
The output is built in ``<output>.partial`` and renamed to ``<output>`` only when every
input is converted, so a file under the output's name is always complete. Re-running the
same command resumes an interrupted conversion from the partial file (images already
stored are skipped, also while a stream is read again from its start), and does nothing
when the output is complete, written with the same options and from the same inputs. An
existing output is otherwise refused, naming what differs; ``--append`` copies it to the
partial file, extends it and renames it back, ``--overwrite`` builds a new one and renames
it over the old, so the original stays whole until then. Progress goes to stderr: a bar on
a terminal, else a line every $ATTN_PROGRESS_SECONDS seconds (30). Errors exit with 2, an
interruption with 130. The inputs' layouts are described in
``common/features/formats/__init__.py``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def inputs(args: argparse.Namespace):
    """(sources, entries, total) of the command's inputs, every input checked before any output exists."""
    from common.features import RegionFeatureError
    from common.features.formats import bottom_up_tsv, lxmert_tsv, mcan_npz, selfcritical_npz
    from common.features.sources import check_distinct

    if args.format == "selfcritical-npz":
        sources = selfcritical_npz.sources(args.att_dir, args.box_dir, args.image_info)
        check_distinct(sources)
        sizes = {}
        for path in args.image_info:
            sizes.update(selfcritical_npz.load_image_sizes(path))
        return sources, selfcritical_npz.entries(args.att_dir, args.box_dir, sizes, args.feature_dim), \
            sources[0]["files"]
    if args.format == "mcan-npz":
        sources = [mcan_npz.source(path) for path in args.inputs]
        check_distinct(sources)
        entries = itertools.chain.from_iterable(mcan_npz.entries(path, args.feature_dim) for path in args.inputs)
        return sources, entries, sum(source["files"] for source in sources)
    module = {"bottom-up-tsv": bottom_up_tsv, "lxmert-tsv": lxmert_tsv}[args.format]
    sources = [module.source(path, args.member) for path in args.inputs]
    if args.member is not None and not any("member" in source for source in sources):
        raise RegionFeatureError(f"--member {args.member}: none of the inputs is a .zip file; drop --member")
    check_distinct(sources)
    return sources, itertools.chain.from_iterable(module.entries(source, args.feature_dim) for source in sources), None


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--output", required=True, type=Path, help="HDF5 file to create (built in <output>.partial)")
    common.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    common.add_argument("--feature-dim", type=int, default=2048)
    existing = common.add_mutually_exclusive_group()
    existing.add_argument("--append", action="store_true",
                          help="add these inputs to an existing output (copied, extended, then renamed back)")
    existing.add_argument("--overwrite", action="store_true",
                          help="rebuild an existing output from these inputs (it is replaced once the new one is "
                               "complete)")
    common.add_argument("--quiet", action="store_true", help="no progress")
    for name, what in (("bottom-up-tsv", "Anderson et al.'s TSV files"), ("lxmert-tsv", "LXMERT *_obj36.tsv files")):
        sub = formats.add_parser(name, parents=[common], help=what)
        sub.add_argument("inputs", nargs="+", type=Path,
                         help=f"{what}: plain, .tsv.gz or .zip files, or streams (a FIFO, - for stdin, <(zcat x.gz))")
        sub.add_argument("--member", metavar="NAME", help="the file to read in a .zip input that holds several")
    what = "directories of MCAN COCO_<split>_<id>.jpg.npz files"
    sub = formats.add_parser("mcan-npz", parents=[common], help=what)
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
    # common.features (h5py, torch) only once the command line is parsed: --help and a bad option answer at once
    from common.features import RegionFeatureError
    from common.features.convert import convert
    from common.features.layout import partial_path
    from common.features.writer import mark_complete
    from common.utils import console

    try:
        if args.format == "mark-complete":
            print(json.dumps({"marked_complete": {str(path): mark_complete(path) for path in args.stores}}))
            return 0
        sources, entries, total = inputs(args)
        counts = convert(entries, args.output, sources, feature_dim=args.feature_dim, dtype=args.dtype, total=total,
                         progress=not args.quiet, append=args.append, overwrite=args.overwrite)
    except RegionFeatureError as err:
        return console.fail(err)
    except KeyboardInterrupt:
        partial = partial_path(args.output) if args.format != "mark-complete" else None
        kept = f"the work so far is in {partial}; " if partial and partial.exists() else ""
        print(f"interrupted: {kept}re-run the same command to resume", file=sys.stderr)
        return 130
    print(json.dumps({"output": str(args.output), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
