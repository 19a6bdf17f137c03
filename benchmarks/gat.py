"""graphattn.GATConv vs torch_geometric.nn.GATConv: time and peak memory, side by side.

    python benchmarks/gat.py [--data-root DIR] [--repeats 30] [--device cuda] [--quick]
                             [--out benchmarks/results/gat.json]

Four measurements, each with both sides in the same run, 2 torch threads (``--threads``), timings
interleaved (ours, PyG, ours, ...) so that load from other processes hits both alike; the
median and the best of ``--repeats`` are reported, with the ratios of both:

1. ``layer``: one layer (Cora, 1433 -> 8 heads x 8, dropout 0.6, training mode) forward and
   backward. Ours with ``bam-wc`` (KL collected and backpropagated) and ``softmax``. Our layer
   keeps the graph it prepared (self-loops, target order, sparse patterns) while it is called
   with the same unchanged ``edge_index``, as in transductive training; the ``*_fresh_graph``
   entries pass a new ``edge_index`` object (a clone, for both sides) every call instead.
2. ``train_step``: a full GAT training step on Cora (zero_grad, forward, loss, backward, Adam).
   PyG's side is its ``examples/gat.py`` model and step (dense ``x``, ``F.dropout``); ours is
   ``graphattn.GAT`` on sparse CSR features (``train.sparse_features``), as ``graphattn.train`` runs it.
3. ``large``: a synthetic graph of 170k nodes and 1.2M edges (64 features, 8 heads x 8), one
   layer forward+backward. Peak memory is measured in a fresh subprocess per side: the
   peak resident set size (``VmHWM``, reset through ``/proc/self/clear_refs``) above the
   resident size before the step (after a warm-up step); ``cache_mib`` is what our layer
   keeps between calls for the graph.

4. ``minibatch_epoch``: a mini-batch training epoch of the two-layer GAT (ours with ``softmax`` and
   with ``bam-wc``, PyG's example model) on the large graph through PyG's ``NeighborLoader`` (fanouts
   10/10, 1024 seed nodes; needs the ``sampler`` extra), the same subgraphs for every side: a fresh
   ``edge_index`` every step. ``--epoch-batches`` (``--quick``: 4) times only the first batches.
   Peak memory per side as in ``large`` (GPU: the largest step).

Our BAM layers run the fused edge-wise kernels (:mod:`common.attention.edge_bam`): the Triton ones with
``--device cuda`` and Triton installed, the C ones on the CPU; ``ATTN_TRITON=0`` and ``ATTN_CPU_KERNELS=0``
time the PyTorch path instead.

Speed targets: BAM-WC layer <= 1.1x PyG (Cora and 1.2M edges), with a reused graph and with a fresh
graph every call, peak memory <= 1.0x. Mini-batch epoch (CPU, 2 threads): BAM-WC <= 1.1x PyG, softmax
<= 1.0x. The JSON records both sides and the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import attention  # noqa: E402
from common.utils import atomic_write_json, environment  # noqa: E402

THREADS = 2  # the setting; --threads changes it (e.g. 1 on a CPU shared with other jobs)
DEVICE = torch.device("cpu")  # --device cuda times both sides on a GPU (synchronised)
SECTIONS = ("layer", "train_step", "large", "minibatch_epoch")
LARGE = {"nodes": 170_000, "edges": 1_200_000, "features": 64, "heads": 8, "channels": 8}


def interleaved(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int = 3):
    """Median and best (minimum) milliseconds of each function, timed in alternation."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            synchronize()
            start = time.perf_counter()
            fn()
            synchronize()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}, {name: min(t) for name, t in times.items()}


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def layer_step(conv, x, edge_index, collect_kl: bool, fresh_graph: bool = False) -> Callable[[], None]:
    """Forward and backward of ``conv``; ``fresh_graph`` passes a new ``edge_index`` object
    (a clone) every call, so that our layer's prepared-graph cache never hits."""
    def step():
        conv.zero_grad(set_to_none=True)
        graph = edge_index.clone() if fresh_graph else edge_index
        if collect_kl:
            with attention.aux_losses() as aux:
                out = conv(x, graph)
            loss = out.square().mean() + 0.1 * aux.total()
        else:
            loss = conv(x, graph).square().mean()
        loss.backward()
    return step


def with_ratios(ms: Dict[str, float], best: Optional[Dict[str, float]] = None) -> Dict:
    """The timings and every ``ours_*`` (and ``*_fresh_graph``) entry over its PyG counterpart,
    for the medians and (``best_ratio_*``) for the best times."""
    def ratios(times, prefix):
        out = {}
        for name, value in times.items():
            if name.startswith("ours_"):
                fresh = name.endswith("_fresh_graph")
                out[f"{prefix}{name[5:]}_vs_pyg"] = value / times["pyg_fresh_graph" if fresh else "pyg"]
        return out
    if best is None:
        return {"ms": ms, **ratios(ms, "ratio_")}
    return {"ms": ms, "best_ms": best, **ratios(ms, "ratio_"), **ratios(best, "best_ratio_")}


def make_layers(in_channels: int, heads: int, channels: int, dropout: float, seed: int = 0):
    """PyG's GATConv and ours (softmax, bam-wc, and a second bam-wc for the fresh-graph
    timings, which would otherwise evict the first one's prepared graph) with the same
    initial weights."""
    from torch_geometric.nn import GATConv as PyGGATConv

    from graphattn import GATConv
    torch.manual_seed(seed)
    pyg = PyGGATConv(in_channels, channels, heads=heads, dropout=dropout).train()
    ours = {}
    for name in ("softmax", "bam-wc", "bam-wc_fresh_graph"):
        conv = GATConv(in_channels, channels, heads=heads, dropout=dropout, attention=name.split("_")[0]).train()
        conv.load_state_dict(pyg.state_dict(), strict=False)
        ours[name] = conv.to(DEVICE)
    return pyg.to(DEVICE), ours


def bench_layer(data, repeats: int) -> Dict:
    """``bam-wc`` with its KL (a training step) and without (sampling only, KL weight 0)."""
    pyg, ours = make_layers(data.num_features, 8, 8, 0.6)
    x, edge_index = data.x.to(DEVICE), data.edge_index.to(DEVICE)
    return with_ratios(*interleaved({
        "ours_bam-wc": layer_step(ours["bam-wc"], x, edge_index, True),
        "pyg": layer_step(pyg, x, edge_index, False),
        "ours_bam-wc_no_kl": layer_step(ours["bam-wc"], x, edge_index, False),
        "ours_softmax": layer_step(ours["softmax"], x, edge_index, False),
        "ours_bam-wc_fresh_graph": layer_step(ours["bam-wc_fresh_graph"], x, edge_index, True, fresh_graph=True),
        "pyg_fresh_graph": layer_step(pyg, x, edge_index, False, fresh_graph=True),
    }, repeats))


class PyGExampleGAT(torch.nn.Module):
    """The model of ``torch_geometric/examples/gat.py``."""

    def __init__(self, in_channels, hidden_channels, out_channels, heads):
        super().__init__()
        from torch_geometric.nn import GATConv as PyGGATConv
        self.conv1 = PyGGATConv(in_channels, hidden_channels, heads, dropout=0.6)
        self.conv2 = PyGGATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


def train_step(model, x, data, kl_weight: float) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)

    def step():
        model.train()
        optimizer.zero_grad()
        if kl_weight:
            with attention.aux_losses() as aux:
                out = model(x, data.edge_index)
            extra = kl_weight * aux.total()
        else:
            out, extra = model(x, data.edge_index), 0.0
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask]) + extra
        loss.backward()
        optimizer.step()
    return step


def bench_train_step(data, repeats: int) -> Dict:
    import warnings

    from graphattn import GAT
    data = data.to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        x_sparse = data.x.to_sparse_csr()
    torch.manual_seed(0)
    pyg = PyGExampleGAT(data.num_features, 8, data.num_classes, 8).to(DEVICE)
    ours_wc = GAT(data.num_features, data.num_classes, attention="bam-wc").to(DEVICE)
    ours_sm = GAT(data.num_features, data.num_classes, attention="softmax").to(DEVICE)
    ms, best = interleaved({
        "ours_bam-wc": train_step(ours_wc, x_sparse, data, 0.1),
        "pyg": train_step(pyg, data.x, data, 0.0),
        "ours_softmax": train_step(ours_sm, x_sparse, data, 0.0),
    }, repeats)
    if DEVICE.type != "cpu":
        return with_ratios(ms, best)
    return {**with_ratios(ms, best), "pyg_step_profile": profile_pyg_step(train_step(pyg, data.x, data, 0.0))}


def profile_pyg_step(step: Callable[[], None], steps: int = 5) -> Dict:
    """Share of PyG's example step spent in each of its five most expensive ops."""
    from torch.profiler import profile
    step()
    with profile() as prof:
        for _ in range(steps):
            step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return {e.key: round(e.self_cpu_time_total / total, 3) for e in events[:5]}


def large_graph(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(LARGE["nodes"], LARGE["features"], generator=g)
    edge_index = torch.randint(0, LARGE["nodes"], (2, LARGE["edges"]), generator=g)
    return x.to(DEVICE), edge_index.to(DEVICE)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def large_memory_child(side: str) -> None:
    """Run in a subprocess: peak RSS increase (MiB) of one large-graph layer step of ``side``."""
    x, edge_index = large_graph()
    pyg, ours = make_layers(LARGE["features"], LARGE["heads"], LARGE["channels"], 0.6)
    conv = pyg if side == "pyg" else ours[side]
    step = layer_step(conv, x, edge_index, collect_kl=side == "bam-wc")
    step()  # allocator warm-up, parameters' .grad
    conv.zero_grad(set_to_none=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _rss_kib("VmRSS")
    step()
    result = {"peak_mib": (_rss_kib("VmHWM") - before) / 1024}
    if side != "pyg":
        result["cache_mib"] = cached_graph_mib(conv)
    print(json.dumps(result))


def cached_graph_mib(conv) -> float:
    """Size of the tensors our layer keeps for the graph between calls."""
    prepared = conv._graph_cache[2]
    tensors = [prepared.sorted.as_tensor(), prepared.csr.src, prepared.csr.ptr]
    if prepared.to_sorted is not None:
        tensors.append(prepared.to_sorted)
    for pattern in prepared.csr._patterns.values():
        tensors += [t for t in (pattern.crow, pattern.col, pattern.value_index, pattern.entry_index) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def cuda_peak_mib(step: Callable[[], None]) -> float:
    """GPU memory allocated at the peak of one step, above what was allocated before it."""
    step()
    torch.cuda.synchronize(DEVICE)
    torch.cuda.reset_peak_memory_stats(DEVICE)
    before = torch.cuda.memory_allocated(DEVICE)
    step()
    torch.cuda.synchronize(DEVICE)
    return (torch.cuda.max_memory_allocated(DEVICE) - before) / 2**20


def bench_large(repeats: int) -> Dict:
    x, edge_index = large_graph()
    pyg, ours = make_layers(LARGE["features"], LARGE["heads"], LARGE["channels"], 0.6)
    timings = with_ratios(*interleaved({
        "ours_bam-wc": layer_step(ours["bam-wc"], x, edge_index, True),
        "pyg": layer_step(pyg, x, edge_index, False),
        "ours_softmax": layer_step(ours["softmax"], x, edge_index, False),
        "ours_bam-wc_fresh_graph": layer_step(ours["bam-wc_fresh_graph"], x, edge_index, True, fresh_graph=True),
        "pyg_fresh_graph": layer_step(pyg, x, edge_index, False, fresh_graph=True),
    }, repeats, warmup=1))
    if DEVICE.type == "cuda":
        return {"graph": LARGE, **timings, "peak_mib": {
            name: cuda_peak_mib(layer_step(conv, x, edge_index, collect_kl=name == "ours_bam-wc"))
            for name, conv in (("ours_bam-wc", ours["bam-wc"]), ("pyg", pyg), ("ours_softmax", ours["softmax"]))}}
    memory, cache = {}, {}
    for side in ("bam-wc", "pyg", "softmax"):
        child = subprocess.run([sys.executable, __file__, "--memory-child", side,
                                "--threads", str(torch.get_num_threads())], capture_output=True,
                               text=True, check=True)
        result = json.loads(child.stdout.strip().splitlines()[-1])
        name = side if side == "pyg" else f"ours_{side}"
        memory[name] = result["peak_mib"]
        if "cache_mib" in result:
            cache[name] = result["cache_mib"]
    return {"graph": LARGE, **timings, "peak_mib": memory, "cache_mib": cache,
            "ratio_memory_bam-wc_vs_pyg": memory["ours_bam-wc"] / memory["pyg"],
            "ratio_memory_softmax_vs_pyg": memory["ours_softmax"] / memory["pyg"]}


#: The mini-batch sides: our GAT with each normalizer (and its KL weight) and PyG's example model.
MINIBATCH_SIDES = {"ours_softmax": ("softmax", 0.0), "ours_bam-wc": ("bam-wc", 0.1), "pyg": (None, 0.0)}


def minibatch_loader(batch_size: int, num_batches: int):
    """PyG's ``NeighborLoader`` (fanouts 10/10) over seed nodes in a fixed random order, on the large graph;
    the graph is stored sorted by target (one ``sort_edge_index``), as a loader's subgraphs then are too."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.utils import sort_edge_index

    from graphattn.minibatch import require_sampler
    require_sampler()
    x, edge_index = (t.cpu() for t in large_graph())  # the sampler runs on the CPU
    edge_index = sort_edge_index(edge_index, num_nodes=LARGE["nodes"], sort_by_row=False)
    y = torch.randint(0, 8, (LARGE["nodes"],), generator=torch.Generator().manual_seed(1))
    seeds = torch.randperm(LARGE["nodes"], generator=torch.Generator().manual_seed(2))
    seeds = seeds[:num_batches * batch_size] if num_batches else seeds
    return NeighborLoader(Data(x=x, edge_index=edge_index, y=y), num_neighbors=[10, 10], input_nodes=seeds,
                          batch_size=batch_size)


def minibatch_models() -> Dict[str, tuple]:
    """Each side's model (same seed) and a step ``step(batch)``: forward on the subgraph, the loss of its
    seed nodes (plus the weighted KL for BAM), backward, Adam."""
    from graphattn import GAT
    steps = {}
    for name, (normalizer, kl_weight) in MINIBATCH_SIDES.items():
        torch.manual_seed(0)
        model = (PyGExampleGAT(LARGE["features"], 8, 8, 8) if normalizer is None
                 else GAT(LARGE["features"], 8, attention=normalizer)).to(DEVICE).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)

        def step(batch, model=model, optimizer=optimizer, kl_weight=kl_weight):
            optimizer.zero_grad()
            with attention.aux_losses() as aux:
                out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size]) + (kl_weight * aux.total() if kl_weight else 0.0)
            loss.backward()
            optimizer.step()
        steps[name] = step
    return steps


def minibatch_memory_child(side: str, batch_size: int) -> None:
    """Run in a subprocess: peak RSS increase (MiB) over the steps of 4 mini-batches of ``side``."""
    loader = iter(minibatch_loader(batch_size, 5))
    step = minibatch_models()[side]
    step(next(loader).to(DEVICE))  # allocator warm-up, Adam state
    batches = [batch.to(DEVICE) for batch in loader]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss_kib("VmRSS")
    for batch in batches:
        step(batch)
    print(json.dumps({"peak_mib": (_rss_kib("VmHWM") - before) / 1024}))


def bench_minibatch_epoch(batch_size: int, num_batches: int) -> Dict:
    """A mini-batch training epoch of the two-layer GAT, ours (softmax; BAM-WC with its KL) against PyG's
    example model, all on the same ``NeighborLoader`` subgraphs of the large graph: a new ``edge_index``
    every step. The subgraphs are sampled once (``sampling_ms``, the same for every side) and the sides'
    steps are timed batch by batch in alternation; ``epoch_ms`` = sampling + model steps. Peak memory:
    GPU memory of the largest step on CUDA, else each side's peak RSS over 4 steps in a subprocess."""
    from graphattn.minibatch import SamplerMissing
    start = time.perf_counter()
    try:
        batches = [batch.to(DEVICE) for batch in minibatch_loader(batch_size, num_batches)]
    except SamplerMissing as err:
        return {"skipped": str(err)}
    sampling_ms = (time.perf_counter() - start) * 1e3
    steps = minibatch_models()
    for step in steps.values():  # warm-up
        step(batches[0])
    total = {name: 0.0 for name in steps}
    for batch in batches:
        for name, step in steps.items():
            synchronize()
            begin = time.perf_counter()
            step(batch)
            synchronize()
            total[name] += (time.perf_counter() - begin) * 1e3
    epoch = {name: sampling_ms + ms for name, ms in total.items()}
    if DEVICE.type == "cuda":
        largest = max(batches, key=lambda b: b.edge_index.size(1))
        memory = {name: cuda_peak_mib(lambda step=step: step(largest)) for name, step in steps.items()}
    else:
        memory = {}
        for name in steps:
            child = subprocess.run([sys.executable, __file__, "--minibatch-memory-child", name, "--batch-size",
                                    str(batch_size), "--threads", str(torch.get_num_threads())],
                                   capture_output=True, text=True, check=True)
            memory[name] = json.loads(child.stdout.strip().splitlines()[-1])["peak_mib"]
    return {"sampler": "NeighborLoader 10/10", "batch_size": batch_size, "batches": len(batches),
            "mean_edges": statistics.mean(b.edge_index.size(1) for b in batches),
            "mean_nodes": statistics.mean(b.num_nodes for b in batches),
            "sampling_ms": sampling_ms, **with_ratios(total),
            "epoch_ms": epoch, "epoch_ratio_ours_softmax_vs_pyg": epoch["ours_softmax"] / epoch["pyg"],
            "epoch_ratio_ours_bam-wc_vs_pyg": epoch["ours_bam-wc"] / epoch["pyg"],
            "peak_mib": memory, "ratio_memory_bam-wc_vs_pyg": memory["ours_bam-wc"] / memory["pyg"],
            "ratio_memory_softmax_vs_pyg": memory["ours_softmax"] / memory["pyg"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", help="directory holding planetoid/ (default: $ATTN_DATA_ROOT)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--large-repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "gat.json")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed nodes per mini-batch")
    parser.add_argument("--epoch-batches", type=int, default=0,
                        help="mini-batches of the epoch benchmark (0 = the whole epoch over every node)")
    parser.add_argument("--quick", action="store_true",
                        help="short CPU run: 10 repeats, 1 on the large graph, 4 mini-batches")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--memory-child", choices=("pyg", "softmax", "bam-wc"), help=argparse.SUPPRESS)
    parser.add_argument("--minibatch-memory-child", choices=tuple(MINIBATCH_SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.large_repeats, args.epoch_batches = 10, 1, args.epoch_batches or 4
    torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.memory_child:
        large_memory_child(args.memory_child)
        return 0
    if args.minibatch_memory_child:
        minibatch_memory_child(args.minibatch_memory_child, args.batch_size)
        return 0
    from graphattn.data import load_planetoid
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    cora = load_planetoid("Cora", args.data_root) if {"layer", "train_step"} & set(sections) else None
    benches = {"layer": lambda: bench_layer(cora, args.repeats),
               "train_step": lambda: bench_train_step(cora, args.repeats),
               "large": lambda: bench_large(args.large_repeats),
               "minibatch_epoch": lambda: bench_minibatch_epoch(args.batch_size, args.epoch_batches)}
    results = {"threads": args.threads, "device": str(DEVICE)}
    for name in SECTIONS:
        if name in sections:
            results[name] = benches[name]()
            print(name, json.dumps(results[name]), flush=True)
    results["environment"] = environment()
    results["load_average"] = os.getloadavg()
    atomic_write_json(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
