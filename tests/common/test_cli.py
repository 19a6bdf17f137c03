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


CLIS = ["graphattn.train", "graphattn.evaluate", "tagging.train", "tagging.evaluate", "nlu.train", "nlu.evaluate",
        "mt.train", "mt.evaluate", "mt.translate", "vqa.train", "vqa.evaluate", "vqa.lxmert.train",
        "vqa.lxmert.evaluate", "captioning.train", "captioning.evaluate", "captioning.visualize"]


@pytest.mark.parametrize("preset", [None, "ACTIVE"])
def test_every_cli_lets_openmp_threads_sleep_before_torch_loads_it(preset):
    """Idle OpenMP threads that spin stalled the CLIs on a shared CPU (benchmarks/busy_cpu.py): each CLI module
    sets OMP_WAIT_POLICY=PASSIVE before torch is imported (libgomp reads it then), and keeps a policy the
    user set."""
    import os
    import subprocess
    import sys
    probe = ("import importlib, os, sys\n"
             f"for name in {CLIS!r}:\n"
             "    importlib.import_module(name)\n"
             "    assert 'torch' not in sys.modules, name + ' imports torch before its arguments are parsed'\n"
             "print(os.environ['OMP_WAIT_POLICY'])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == (preset or "PASSIVE")


def test_the_gat_trains_on_one_thread_unless_told_otherwise():
    """On one thread a Planetoid graph trains about 15 % slower than on two idle cores but never stalls beside
    other work (4.56x -> 1.33x its idle time; docs/utilities.md, "Threads on a shared CPU")."""
    from graphattn.config import load_config
    assert load_config().train.num_threads == 1
