"""LXMERT on the shared runtime: bf16 autocast follows fp32, and a run written on a GPU evaluates on
the CPU."""
import pytest

from vqa.lxmert import evaluate

from ...runtime_checks import BF16, assert_follows, rewrite_as_written_on_cuda
from ..probes import lxmert_probe


@pytest.mark.parametrize("variant", ["bam", "entmax"])
def test_bf16_autocast_training_follows_fp32(vqa_root, tmp_path, variant):
    root = vqa_root[0]
    fp32 = lxmert_probe(root, tmp_path, precision="fp32", variant=variant)
    bf16 = lxmert_probe(root, tmp_path, precision="bf16", variant=variant)
    assert_follows(bf16, fp32, **BF16)
    assert bf16["results"]["runtime"]["precision"] == "bf16"


def test_a_run_written_on_a_gpu_evaluates_on_the_cpu(vqa_root, tmp_path):
    run = lxmert_probe(vqa_root[0], tmp_path, variant="softmax")
    assert rewrite_as_written_on_cuda(run["out"]) == 1
    record = evaluate.evaluate_run(run["out"], progress=False)
    assert record["accuracy"] == run["results"]["final_eval"]
