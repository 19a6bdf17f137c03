"""Dense BAM kernel tiles on the GPU at hand: each candidate's error and the time of a training call.

    python benchmarks/dense_bam_tiles.py [--dtype bf16] [--head-dim 64] [--length 4096] [--batch-heads 32]
        [--forward 128x64x8x2 ...] [--backward 32x128x8x2 16x64x8x2 ...] [--dropout 0.1]

A tile is ``BLOCK_MxBLOCK_NxWARPSxSTAGES`` (forward: queries x keys per step; backward: queries per step x
keys per program). The shipped tiles (``common.attention.kernels.dense_bam.tiles``) run first, then every
forward candidate with the shipped backward and every backward candidate with the shipped forward. For each:
the relative error of the output, the KL and the gradients of q, k, v and the prior network against the
float32 materialised path under the kernels' own draws (a tile that computes wrong numbers is reported,
never timed), and the median of a BAM-WC forward + backward with its KL (CUDA events, ABBA rounds against
the shipped tiles). On an H200 a 16 x 16 TF32 backward tile was exact in Triton's interpreter and wrong
compiled (docs/gpu.md): the error column is why this script exists. Writes ``results/dense_bam_tiles.json``.
Runs in Triton's interpreter too (``TRITON_INTERPRET=1``, tiny sizes: errors only, no times).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path
from typing import Iterator, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measure import environment, rotated_times, write_json  # noqa: E402

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: The launch options a tile sets, in the order of ``BLOCK_MxBLOCK_NxWARPSxSTAGES``.
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
#: Largest relative error (of the worst output or gradient) a tile may show and still be timed.
TOLERANCE = {"bf16": 3e-2, "fp16": 1e-2, "fp32": 1e-2}


def parse_tile(text: str) -> tuple:
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: write BLOCK_MxBLOCK_NxWARPSxSTAGES, e.g. 32x128x8x2")
    return tuple(int(p) for p in parts)


class TileChoice:
    """Inside ``with``, the kernels' tile lookup gives ``forward`` / ``backward`` where set (None: the shipped
    tile); the shipped lookup is back on leaving."""

    def __init__(self):
        from common.attention.kernels import dense_bam as kernels
        self.kernels, self.shipped = kernels, kernels.tiles
        self.forward: Optional[tuple] = None
        self.backward: Optional[tuple] = None

    def __enter__(self) -> "TileChoice":
        self.kernels.tiles = self
        return self

    def __exit__(self, *exc) -> None:
        self.kernels.tiles = self.shipped

    def __call__(self, dtype, d, dv, interpret, lognormal=False):
        tiles = self.shipped(dtype, d, dv, interpret, lognormal)
        if tiles is None:
            return None
        forward = {**tiles.forward, **dict(zip(TILE_KEYS, self.forward))} if self.forward else tiles.forward
        backward = {**tiles.backward, **dict(zip(TILE_KEYS, self.backward))} if self.backward else tiles.backward
        return self.kernels.Tiles(forward, backward)

    def describe(self, dtype, d, interpret: bool) -> dict:
        """The shipped tiles as ``BLOCK_MxBLOCK_NxWARPSxSTAGES`` per pass."""
        tiles = self.shipped(dtype, d, d, interpret)
        return {pass_: "x".join(str(getattr(tiles, pass_).get(k, "-")) for k in TILE_KEYS)
                for pass_ in ("forward", "backward")} if tiles else {}


@contextlib.contextmanager
def kernel_settings(device: str) -> Iterator[None]:
    """While the sweep runs: TF32 products allowed (as the trainers allow them), and on a CPU the kernels in
    Triton's interpreter rather than the CPU path (``ATTN_TRITON=1``); both as they were afterwards."""
    from common.attention.kernels import tf32_products

    saved = os.environ.get("ATTN_TRITON")
    if device == "cpu":
        os.environ["ATTN_TRITON"] = "1"
    try:
        with tf32_products(True):
            yield
    finally:
        if saved is None:
            os.environ.pop("ATTN_TRITON", None)
        else:
            os.environ["ATTN_TRITON"] = saved


def errors(q, k, v, mask, norm, dropout: float) -> dict:
    """Relative errors (max |a - b| / max |b|, the scale floored at 1e-3) of the operator's output, KL and
    gradients against the float32 materialised path under the same noise and dropout draws."""
    import torch

    from common import attention
    from common.attention import dense_bam
    from common.attention.groups import make_groups
    from common.attention.kernels.dense_bam import NOISE_WEIBULL, NOISE_LOGNORMAL, seed_for_call, standard_noise
    B, H, L, d = q.shape
    torch.manual_seed(5)
    with attention.aux_losses() as aux:
        out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, dropout=dropout)
    kl = aux.total()
    torch.manual_seed(5)
    kind = NOISE_WEIBULL if norm.posterior == "weibull" else NOISE_LOGNORMAL
    noise, keep = standard_noise(B * H, L, L, kind, seed_for_call(q.device), dropout, q.device)
    qf, kf, vf = (x.float() for x in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) * d ** -0.5
    with attention.aux_losses() as ref_aux:
        weights = norm.normalize(scores, make_groups(scores, mask), keys=kf, noise=noise.view(B, H, L, L))
    ref_out, ref_kl = (weights * keep.view(B, H, L, L)) @ vf, ref_aux.total()
    upstream = torch.randn(out.shape, device=q.device, generator=torch.Generator(q.device).manual_seed(1))
    inputs = [q, k, v, *norm.parameters()]
    got = torch.autograd.grad((out.float() * upstream).sum() + kl, inputs)
    want = torch.autograd.grad((ref_out * upstream).sum() + ref_kl, inputs)
    names = ["out", "kl", "dq", "dk", "dv"] + [f"d_{n}" for n, _ in norm.named_parameters()]
    pairs = [(out, ref_out), (kl, ref_kl), *zip(got, want)]

    def relative(a, b):
        a, b = a.detach().float(), b.detach().float()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-3))
    return {name: relative(a, b) for name, (a, b) in zip(names, pairs)}


def sweep(args, choice: TileChoice, q, k, v, mask, norm, device: str) -> list:
    """The shipped tiles, then each candidate: its errors, and its time where it is right and a GPU is here."""
    import torch

    from common import attention
    from common.attention import dense_bam

    def step():
        with attention.aux_losses() as aux:
            out = dense_bam.dense_bam_attention(norm, q, k, v, mask=mask, dropout=args.dropout)
        torch.autograd.backward([out.float().sum(), aux.total()])

    def with_tiles(forward, backward):
        def call():
            choice.forward, choice.backward = forward, backward
            step()
        return call

    rows = []
    for forward, backward in [(None, None)] + [(t, None) for t in args.forward] + [(None, t) for t in args.backward]:
        choice.forward, choice.backward = forward, backward
        row = {"forward": "x".join(map(str, forward)) if forward else "shipped",
               "backward": "x".join(map(str, backward)) if backward else "shipped"}
        try:
            row["errors"] = errors(q, k, v, mask, norm, args.dropout)
            row["worst"] = max(row["errors"].values())
            row["right"] = row["worst"] <= TOLERANCE[args.dtype]
        except Exception as error:  # a tile that does not compile or launch
            row["failed"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if row.get("right") and device == "cuda":
            fns = {"candidate": with_tiles(forward, backward), "shipped": with_tiles(None, None)}
            rotated_times(fns, 2, device)  # warm-up: compilation and loading
            times = rotated_times(fns, args.rounds, device)
            row["ms"] = 1e3 * statistics.median(times["candidate"])
            row["vs_shipped"] = statistics.median(a / b for a, b in zip(times["candidate"], times["shipped"]))
        rows.append(row)
        shown = (f"{row['ms']:.3f} ms, x{row['vs_shipped']:.3f} shipped" if "ms" in row else
                 row.get("failed") or ("WRONG" if not row.get("right") else "not timed (no GPU)"))
        worst = f"worst error {row['worst']:.1e} " if "worst" in row else ""
        print(f"forward {row['forward']:>12} backward {row['backward']:>12}: {worst}{shown}", flush=True)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch-heads", type=int, default=32, help="batch x heads (heads: 8)")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--forward", type=parse_tile, nargs="*", default=[], help="forward tiles to try")
    parser.add_argument("--backward", type=parse_tile, nargs="*", default=[], help="backward tiles to try")
    parser.add_argument("--rounds", type=int, default=20, help="timed ABBA rounds per candidate (default 20)")
    args = parser.parse_args(argv)
    if args.batch_heads % 8:
        parser.error("--batch-heads must be a multiple of 8 (8 heads)")

    import torch

    from common import attention
    from common.attention.kernels import interpreting

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not interpreting():
        parser.error("needs a CUDA GPU, or TRITON_INTERPRET=1 for the error column alone")
    dtype = getattr(torch, DTYPES[args.dtype])
    B, H, L, d = args.batch_heads // 8, 8, args.length, args.head_dim
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, d, device=device, generator=g).to(dtype).requires_grad_() for _ in range(3))
    lengths = torch.tensor([L, L * 2 // 3], device=device).repeat(B)[:B]
    mask = (torch.arange(L, device=device) < lengths[:, None]).view(B, 1, 1, L)
    norm = attention.build("bam-wc", key_dim=d).to(device).train()
    with TileChoice() as choice, kernel_settings(device):
        shipped = choice.describe(dtype, d, interpreting())
        if not shipped:
            parser.error(f"{args.dtype} with head size {d} has no kernel tiles here: the chunked path takes it")
        rows = sweep(args, choice, q, k, v, mask, norm, device)
    path = write_json("dense_bam_tiles", {
        "environment": environment(threads=torch.get_num_threads()), "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "dtype": args.dtype, "head_dim": d,
        "length": L, "batch_heads": args.batch_heads, "dropout": args.dropout, "shipped": shipped,
        "tolerance": TOLERANCE[args.dtype], "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
