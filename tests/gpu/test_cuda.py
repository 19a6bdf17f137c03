"""One short training run and one evaluation per domain on CUDA, in fp32 and bf16, each following the
same run on the CPU (tests/runtime_checks.py gives the tolerances), and checkpoints moving between the
two. BAM's noise is made negligible (k = 1e6) and dropout is off, since the CPU and the GPU draw
different random numbers."""
import importlib.util
import shutil

import pytest
import torch

from common.utils.runtime import Runtime

from ..captioning.probes import train_probe as captioning_probe
from ..captioning.probes import validation_nll
from ..graphattn.probes import evaluate_probe
from ..graphattn.probes import train_probe as gat_probe
from ..mt.probes import train_probe as mt_probe
from ..runtime_checks import BF16, CUDA_FP32, assert_follows
from ..vqa.probes import lxmert_probe, mcan_probe

pytestmark = pytest.mark.cuda
PRECISIONS = [("fp32", CUDA_FP32), ("bf16", BF16)]
NO_NOISE = "attention.options.k=1e6"


@pytest.mark.parametrize("precision,tolerance", PRECISIONS)
def test_gat(precision, tolerance):
    cpu = gat_probe("cpu", "fp32", extra=[NO_NOISE])
    cuda = gat_probe("cuda", precision, extra=[NO_NOISE])
    assert_follows(cuda, cpu, **tolerance)
    assert next(iter(cuda["checkpoint"]["model_state"].values())).is_cuda
    # the GPU-trained model on the CPU, the CPU-trained one on the GPU
    assert evaluate_probe(cuda["checkpoint"], cuda["cfg"], cuda["data"], "cpu", precision) == pytest.approx(
        cuda["eval"], rel=tolerance["rel"], abs=tolerance["abs"])
    assert evaluate_probe(cpu["checkpoint"], cpu["cfg"], cpu["data"], "cuda") == pytest.approx(
        cpu["eval"], rel=CUDA_FP32["rel"], abs=CUDA_FP32["abs"])


@pytest.mark.parametrize("precision,tolerance", PRECISIONS)
def test_gat_neighbor_loader(precision, tolerance):
    """NeighborLoader batches (sampled on the CPU) trained on CUDA, evaluated layer-wise on CUDA: the CPU run."""
    pytest.importorskip("torch_sparse", reason="the sampler extra (torch-sparse) is not installed")
    loader = [NO_NOISE, "loader.kind=neighbor", "loader.num_neighbors=[-1,-1]", "loader.batch_size=8"]
    assert_follows(gat_probe("cuda", precision, extra=loader), gat_probe("cpu", "fp32", extra=loader), **tolerance)


@pytest.mark.parametrize("arch", ["lstm", "transformer"])
@pytest.mark.parametrize("precision,tolerance", PRECISIONS)
def test_mt(tiny_root, tmp_path, arch, precision, tolerance):
    options = ["model.normalizer_options={k: 1e6}"] if arch == "lstm" else [
        "model.encoder_attention={normalizer: bam-wc, normalizer_options: {k: 1e6}, "
        "cross_layer: {kind: evolving, alpha: 0.5, beta: 0.5}}"]
    cpu = mt_probe(tiny_root, tmp_path, arch, "cpu", "fp32", extra=options)
    assert_follows(mt_probe(tiny_root, tmp_path, arch, "cuda", precision, extra=options), cpu, **tolerance)


def _caption_metrics_missing() -> "str | None":
    """Why the captioning trainer's validation cannot run here: it scores with pycocoevalcap (PTB tokenizer,
    BLEU, METEOR, ROUGE-L, CIDEr), which runs Java. Its wheel (100 MB of Java jars) is not in the GPU bundle
    (scripts/gpu_bundle.sh), and GPU images may have no Java."""
    if importlib.util.find_spec("pycocoevalcap") is None:
        return "pycocoevalcap is not installed (the captioning trainer validates with its metrics)"
    if shutil.which("java") is None:
        return "no java on PATH (pycocoevalcap's tokenizer and METEOR run Java)"
    return None


@pytest.mark.parametrize("precision,tolerance", PRECISIONS)
def test_captioning(coco_fixture, tiny_overrides, tmp_path, precision, tolerance):
    if (reason := _caption_metrics_missing()) is not None:
        pytest.skip(reason)
    root = coco_fixture["root"]
    cpu = captioning_probe(root, tmp_path, tiny_overrides, "cpu", "fp32", extra=[NO_NOISE])
    cuda = captioning_probe(root, tmp_path, tiny_overrides, "cuda", precision, extra=[NO_NOISE])
    assert_follows(cuda, cpu, **tolerance)
    assert validation_nll(cuda["out"] / "best.pt", cuda["cfg"], Runtime(torch.device("cpu"))) == pytest.approx(
        cuda["eval"], rel=tolerance["rel"], abs=tolerance["abs"])


@pytest.mark.parametrize("precision,tolerance", PRECISIONS)
def test_mcan(vqa_fixture, tmp_path, precision, tolerance):
    cpu = mcan_probe(vqa_fixture.root, tmp_path, "cpu", "fp32", extra=[NO_NOISE])
    assert_follows(mcan_probe(vqa_fixture.root, tmp_path, "cuda", precision, extra=[NO_NOISE]), cpu, **tolerance)


@pytest.mark.parametrize("precision,tolerance", PRECISIONS)
def test_lxmert(vqa_root, tmp_path, precision, tolerance):
    options = ["model.adaptation.normalizer_options={k: 1000000}"]  # an integer: the config keeps k = 10 an int
    cpu = lxmert_probe(vqa_root[0], tmp_path, "cpu", "fp32", extra=options)
    cuda = lxmert_probe(vqa_root[0], tmp_path, "cuda", precision, extra=options)
    assert_follows(cuda, cpu, **tolerance)
    assert cuda["results"]["runtime"]["gpu"]
