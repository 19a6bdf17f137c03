from common.utils.cli import overrides_from, training_parser


def parse(argv):
    parser = training_parser("python -m demo.train", "Train a demo.", "demo/configs/demo.yaml", "optim.lr=0.1")
    parser.add_argument("--attention")
    return parser.parse_intermixed_args(argv)


def test_named_options_become_overrides_after_the_free_ones():
    args = parse(["optim.lr=0.1", "--data-root", "/data", "--attention", "bam-wc", "--no-progress", "model.layers=2"])
    assert args.no_progress and args.config is None
    assert overrides_from(args, {"attention.name": args.attention, "train.epochs": None}) == [
        "optim.lr=0.1", "model.layers=2", "data_root=/data", "attention.name=bam-wc"]


def test_nothing_given_gives_no_overrides():
    assert overrides_from(parse([])) == []


def test_help_names_the_defaults_file():
    parser = training_parser("python -m demo.train", "Train a demo.", "demo/configs/demo.yaml", "optim.lr=0.1")
    assert "demo/configs/demo.yaml" in parser.format_help() and "optim.lr=0.1" in parser.format_help()
