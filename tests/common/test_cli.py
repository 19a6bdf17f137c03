import pytest

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


def test_threads_is_one_option_on_every_train_cli_mapped_to_its_config_key():
    args = parse(["--threads", "1", "--out", "runs/x"])
    assert overrides_from(args) == ["out_dir=runs/x", "train.num_threads=1"]
    assert overrides_from(args, threads_key="train.threads") == ["out_dir=runs/x", "train.threads=1"]


@pytest.mark.parametrize("module, key", [("graphattn.train", "train.num_threads"), ("mt.train", "train.threads"),
                                         ("captioning.train", "train.num_threads"), ("vqa.train", "train.num_threads"),
                                         ("vqa.lxmert.train", "train.num_threads")])
def test_every_train_cli_takes_the_shared_options(module, key, monkeypatch):
    """--device, --threads, --data-root, --out, --config and --no-progress everywhere: the config
    reaches the loader with the thread count under the domain's key."""
    import importlib

    seen = {}
    mod = importlib.import_module(module)

    def stop(*args, **kwargs):
        seen["overrides"] = [a for a in (*args, *kwargs.values()) if isinstance(a, list)][0]
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, "load_config", stop)
    assert mod.main(["--threads", "2", "--device", "cpu", "--no-progress", "--out", "runs/x"]) == 130
    assert f"{key}=2" in seen["overrides"] and "device=cpu" in seen["overrides"]
