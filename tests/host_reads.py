"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: run a step on the ``meta`` device (where
nothing is computed) as if it were a GPU, and record every host read and host-to-device copy in it.

The library chooses its paths from the device (``x.device.type == "cpu"`` shortcuts, ``use_triton``); on
``meta`` it takes the GPU's: the Triton wrappers run (their launches are skipped) and the custom operators
run their fake implementations. :class:`HostReads` records

* reads of a device tensor's values: ``.item()``, ``bool``/``int``/``float`` of it, ``.tolist()``;
* host-to-device copies: ``torch.tensor`` / ``torch.as_tensor`` / ``Tensor.new_tensor`` of Python data on
  the device, ``.to(device)`` / ``.copy_`` of a CPU tensor;
* operators whose output size depends on values (``nonzero``, boolean-mask indexing, ``unique``, ...)
  and ``repeat_interleave`` without ``output_size``.

What it cannot see: synchronisations inside a kernel launch or a real custom operator (the launches are
skipped here, the operators run their fake implementations), and in CUDA's caching allocator.
"""
from __future__ import annotations

import contextlib
import sys
import traceback

import torch
from torch._library import custom_ops
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_READS = {torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
          torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.numpy}
_SIZED_BY_VALUES = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
                    "bincount", "histc", "_local_scalar_dense", "is_nonzero", "equal"}


def _on_device(device) -> bool:
    return device is not None and torch.device(device).type not in ("cpu",)


def _target_device(args, kwargs):
    """The device of a ``Tensor.to`` call, or None."""
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (str, torch.device)):
            return a
    return None


#: the recorders entered, innermost last (a custom operator's implementation records into the innermost)
_ACTIVE: list = []


class HostReads(TorchFunctionMode):
    """Records (in :attr:`found`) every host read or host-to-device copy of the calls made inside it."""

    def __init__(self, found: "list | None" = None):
        super().__init__()
        self.found: list = [] if found is None else found
        self._dispatch = _SizedByValues(self.found)

    def _hit(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "torch/" not in f.filename
                  and not f.filename.endswith("host_reads.py")]
        self.found.append((what, "".join(traceback.format_list(frames[-6:]))))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS and isinstance(args[0], torch.Tensor) and _on_device(args[0].device):
            self._hit(f"{getattr(func, '__name__', func)} of a device tensor")
        elif func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor) \
                and _on_device(kwargs.get("device")):
            self._hit(f"{func.__name__}(<python data>, device={kwargs.get('device')})")
        elif func is torch.Tensor.new_tensor and not isinstance(args[1], torch.Tensor) \
                and _on_device(kwargs.get("device", args[0].device)):
            self._hit("new_tensor(<python data>) on the device")
        elif func in (torch.Tensor.to, torch.Tensor.cuda) and args[0].device.type == "cpu" \
                and _on_device(_target_device(args, kwargs) if func is torch.Tensor.to else "cuda"):
            self._hit(f"{func.__name__} of a CPU tensor {tuple(args[0].shape)} to the device")
        elif func is torch.Tensor.copy_ and isinstance(args[1], torch.Tensor) and args[1].device.type == "cpu" \
                and _on_device(args[0].device):
            self._hit("copy_ from a CPU tensor to the device")
        return func(*args, **kwargs)

    def __enter__(self):
        _ACTIVE.append(self)
        self._dispatch.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.pop()
        super().__exit__(*exc)
        return self._dispatch.__exit__(*exc)

    def report(self) -> str:
        seen, lines = set(), []
        for what, where in self.found:
            if (what, where) not in seen:
                seen.add((what, where))
                lines.append(f"{what}\n{where}")
        return "\n".join(lines)


class _SizedByValues(TorchDispatchMode):
    def __init__(self, found: list):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        on_device = any(_on_device(t.device) for t in tensors)
        if on_device and (name in _SIZED_BY_VALUES or (name == "repeat_interleave" and kwargs.get("output_size") is None
                                                       and tensors and not tensors[0].is_floating_point())):
            frames = [f for f in traceback.extract_stack()[:-2] if "torch/" not in f.filename]
            self.found.append((name, "".join(traceback.format_list(frames[-6:]))))
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_as_gpu(monkeypatch):
    """Make the library treat ``meta`` tensors as a GPU's: autocast is off there, ``use_triton`` says yes
    (as for CUDA), and kernel launches and precompilations do nothing."""
    import common.attention  # noqa: F401  (every module that imports the patched names)
    from common.attention import kernels
    operators = custom_operators()  # (their modules imported before the names are replaced)

    is_autocast = torch.is_autocast_enabled
    autocast = torch.autocast
    monkeypatch.setattr(torch, "is_autocast_enabled",
                        lambda *a: False if a and str(a[0]) == "meta" else is_autocast(*a))
    monkeypatch.setattr(torch, "autocast", lambda device_type, *a, **k: contextlib.nullcontext()
                        if str(device_type) == "meta" else autocast(device_type, *a, **k))
    original = kernels.use_triton

    def use_triton(x, family: str = "", behind_op: bool = False) -> bool:
        if x.device.type != "meta":
            return original(x, family, behind_op)
        import os
        return (os.environ.get("ATTN_TRITON", "auto") != "0" and family not in kernels.FAILED
                and kernels.triton_available() and (behind_op or not torch.compiler.is_compiling()))

    replacements = {"use_triton": use_triton, "launch": lambda *a, **k: None, "precompile": lambda *a, **k: None}
    originals = {attr: getattr(kernels, attr) for attr in replacements}  # before kernels' own names are replaced,
    for module in list(sys.modules.values()):                            # whatever the modules' import order
        name = getattr(module, "__name__", "") or ""
        if name.startswith("common.attention"):
            for attr, fn in replacements.items():
                if getattr(module, attr, None) is originals[attr]:
                    monkeypatch.setattr(module, attr, fn)
    # the custom operators run their real implementations (the Triton wrappers), not their fake ones
    for op in operators:
        monkeypatch.setattr(op, "_abstract_fn", _recorded(op._init_fn))
    yield


def custom_operators() -> list:
    """The suite's custom operators (``torch.ops.attention_suite.*``), from torch's registry once the modules
    defining them are imported (the CSR entmax kernels' where Triton is installed)."""
    import common.attention.dense_bam  # noqa: F401
    import common.attention.dense_bam_op  # noqa: F401
    import common.attention.edge_bam  # noqa: F401
    import common.attention.entmax  # noqa: F401
    from common.attention import kernels
    if kernels.triton_available():
        import common.attention.kernels.entmax_bisect  # noqa: F401
    return [op for name, op in custom_ops.OPDEFS.items() if name.startswith("attention_suite::")]


def _recorded(implementation):
    """``implementation`` run under a fresh recorder that adds to the active one's findings: a custom
    operator's body runs below the recorder's modes, which do not see into it."""
    def run(*args, **kwargs):
        if not _ACTIVE:
            return implementation(*args, **kwargs)
        with HostReads(_ACTIVE[-1].found):
            return implementation(*args, **kwargs)
    return run
