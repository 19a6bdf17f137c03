"""Edge-wise BAM (Fan et al., NeurIPS 2020, Sec. 3.2-3.3) by fused kernels, one per pass, as custom operators.

Over edges sorted by target (the CSR pointer ``ptr`` of the groups), a pass visits each target
node's segment once with all its heads: the forward pass writes the sampled weights
``W = softmax(s + scale * n)`` and the segment's share of the mean KL (Eq. 4), the backward
pass draws the noise ``n`` again instead of storing it. The kernels:

* on CUDA (or in Triton's interpreter, where :func:`~common.attention.kernels.use_triton` says so),
  the Triton kernels of :mod:`common.attention.kernels.edge_bam`;
* on the CPU, for float32 scores, the C kernels of :mod:`common.attention.kernels.cpu_edge_bam`
  (compiled on first use; ``ATTN_CPU_KERNELS=0`` keeps the PyTorch path).

Both passes are custom operators, ``torch.ops.attention_suite.edge_bam`` and ``edge_bam_backward``,
with fake implementations and the gradient registered, so that ``torch.compile`` keeps them in its
graph. The two kinds of kernel draw different noise (each from its own counter-based generator,
seeded from torch's); with the noise given explicitly both equal the PyTorch path of
:class:`~common.attention.bam.BAM`.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .kernels import cpu_edge_bam, use_triton

#: Noise sources of the kernels.
NOISE_NONE, NOISE_WEIBULL, NOISE_NORMAL, NOISE_GIVEN = 0, 1, 2, 3
#: KL closed forms: none, Weibull-Gamma (fixed / contextual), Lognormal (fixed / contextual).
KL_NONE, KL_WEIBULL, KL_LOGNORMAL = 0, 1, 2


class Options(NamedTuple):
    """The constants of one BAM normalizer call, as the operators take them (plain numbers)."""

    noise: int  # NOISE_*
    scale: float  # of the standard log-noise
    prior: bool  # contextual prior logits given
    prior_normalized: bool  # they are log pi already (prior_scope="all")
    kl: int  # KL_*
    c0: float  # Weibull: log beta; Lognormal: the scale 1 / (2 sigma_p^2)
    c1: float  # Weibull: c; Lognormal: the offset
    c2: float  # Weibull, fixed prior: alpha
    const: float  # the closed form's constant term
    centred: bool  # d KL / d log p sums to zero per segment

    @classmethod
    def of(cls, bam, sampling: bool, with_kl: bool, given_noise: bool) -> "Options":
        """The options of :class:`~common.attention.bam.BAM` ``bam`` for a call."""
        weibull = bam.posterior == "weibull"
        contextual = bam.prior_net is not None
        kernel = bam.kl_kernel
        if weibull:
            c = (kernel.log_beta, kernel.c, 0.0 if contextual else kernel.alpha)
        else:
            c = (kernel.scale, kernel.offset, 0.0)
        noise = NOISE_WEIBULL if weibull else NOISE_NORMAL
        noise = NOISE_NONE if not sampling else NOISE_GIVEN if given_noise else noise
        return cls(noise, bam.noise_scale, contextual and with_kl, bam.prior_scope == "all",
                   KL_NONE if not with_kl else KL_WEIBULL if weibull else KL_LOGNORMAL, *c,
                   kernel.const if with_kl else 0.0, bool(kernel.centred_score_grad))


def fused(scores: Tensor) -> bool:
    """Whether the fused kernels take edge-wise ``scores`` (``[num_edges(, heads)]``): the Triton kernels where
    :func:`~common.attention.kernels.use_triton` says so, else the C kernels where they take them."""
    return scores.dim() <= 2 and (use_triton(scores, "edge_bam", behind_op=True) or cpu_edge_bam.takes(scores))


def _kernels(scores: Tensor):
    """The launchers for ``scores``: Triton's where :func:`~common.attention.kernels.use_triton` says so, else
    the C kernels."""
    if use_triton(scores, "edge_bam", behind_op=True):
        from .kernels import edge_bam
        return edge_bam
    return cpu_edge_bam


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("attention_suite::edge_bam", mutates_args=())
def edge_bam_op(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor, seed: Tensor,
                noise_kind: int, scale: float, prior: bool, prior_normalized: bool, kl: int, c0: float, c1: float,
                c2: float, const: float, centred: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(weights, mean KL, lse)`` of contiguous ``scores [num_edges, heads]`` over the segments of ``ptr``,
    the arguments after the seed tensor being :class:`Options`; ``lse [nodes, 3, heads]`` holds what the
    gradient, ``attention_suite::edge_bam_backward``, reads."""
    return _kernels(scores).forward(scores, prior_logits, noise, ptr, seed, noise_kind, scale, prior,
                                    prior_normalized, kl, c0, c1, c2, const, centred)


@edge_bam_op.register_fake
def _(scores, prior_logits, noise, ptr, seed, *options):
    compute = _compute_dtype(scores.dtype)
    return (torch.empty_like(scores), scores.new_empty((), dtype=compute),
            scores.new_empty(ptr.shape[0] - 1, 3, scores.shape[1], dtype=compute))


@torch.library.custom_op("attention_suite::edge_bam_backward", mutates_args=())
def edge_bam_backward_op(scores: Tensor, prior_logits: Optional[Tensor], noise: Optional[Tensor], ptr: Tensor,
                         seed: Tensor, lse: Tensor, grad_weights: Optional[Tensor], grad_kl: Optional[Tensor],
                         noise_kind: int, scale: float, prior: bool, prior_normalized: bool, kl: int, c0: float,
                         c1: float, c2: float, const: float, centred: bool) -> tuple[Tensor, Tensor]:
    """``(d scores, d prior logits)`` of :func:`edge_bam_op` for the gradients of its weights and mean KL
    (None: zero); the prior's is empty without prior logits."""
    return _kernels(scores).backward(scores, prior_logits, noise, ptr, seed, lse, grad_weights, grad_kl,
                                     noise_kind, scale, prior, prior_normalized, kl, c0, c1, c2, const, centred)


@edge_bam_backward_op.register_fake
def _(scores, prior_logits, noise, ptr, seed, lse, grad_weights, grad_kl, *options):
    return torch.empty_like(scores), scores.new_empty(0) if prior_logits is None else torch.empty_like(prior_logits)


def _setup(ctx, inputs, output):
    scores, prior_logits, noise, ptr, seed, *options = inputs
    ctx.save_for_backward(scores, prior_logits, noise, ptr, seed, output[2])
    ctx.options = options
    ctx.set_materialize_grads(False)  # no zeros for the log-sum-exps' gradient (nor an unused output's)


def _gradient(ctx, grad_weights, grad_kl, grad_lse):
    scores, prior_logits, noise, ptr, seed, lse = ctx.saved_tensors
    d_scores, d_prior = edge_bam_backward_op(scores, prior_logits, noise, ptr, seed, lse, grad_weights, grad_kl,
                                             *ctx.options)
    return d_scores, None if prior_logits is None else d_prior, *([None] * (3 + len(ctx.options)))


edge_bam_op.register_autograd(_gradient, setup_context=_setup)


def edge_bam(bam, scores: Tensor, ptr: Tensor, prior_logits: Optional[Tensor] = None, *,
             noise: Optional[Tensor] = None, sampling: bool = True, with_kl: bool = True,
             seed: Optional[Union[int, Tensor]] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """The weights and the mean KL of :class:`~common.attention.bam.BAM` ``bam`` over
    target-sorted edges, by the fused kernels (the operator :func:`edge_bam_op`).

    Args:
        scores: ``[num_edges, heads]``, in the order of ``ptr``.
        ptr: ``[num_nodes + 1]`` CSR pointer of the targets.
        prior_logits: ``[num_edges, heads]`` contextual prior logits (contextual priors only).
        noise: the standard log-noise (``log(-log u)`` or ``eps``, ``[num_edges, heads]``);
            ``None`` draws it in the kernel from Philox at ``seed`` (an int or a one-element integer
            tensor); ``seed`` defaults to one drawn on the device from torch's generator, so
            ``torch.manual_seed`` repeats it and nothing is read back to the host.
        sampling: ``False`` gives the posterior mean (softmax) and no noise.
        with_kl: whether to compute the KL (``None`` is returned otherwise).
    """
    if scores.dim() != 2 or (prior_logits is not None and prior_logits.shape != scores.shape):
        raise ValueError(f"edge_bam takes scores [num_edges, heads] and prior logits of the same shape, got "
                         f"{tuple(scores.shape)} and {None if prior_logits is None else tuple(prior_logits.shape)}")
    options = Options.of(bam, sampling, with_kl, noise is not None)
    if options.prior and prior_logits is None:
        raise ValueError(f"{bam.extra_repr()}: a contextual prior needs prior_logits=...")
    if seed is None:
        seed = torch.randint(0, 2**31 - 1, (1,), device=scores.device)
    elif not isinstance(seed, Tensor):
        seed = torch.full((1,), int(seed), dtype=torch.int64, device=scores.device)  # no host-to-device copy
    prior_logits = prior_logits.contiguous() if options.prior else None
    noise = noise.to(scores.dtype).contiguous() if options.noise == NOISE_GIVEN else None
    weights, kl, _ = edge_bam_op(scores.contiguous(), prior_logits, noise, ptr.contiguous(), seed, *options)
    return weights, kl if with_kl else None


def bam_normalize(bam, scores: Tensor, groups, keys=None, key_index=None, noise: Optional[Tensor] = None) -> Tensor:
    """:meth:`BAM.normalize <common.attention.bam.BAM.normalize>` for edge-wise groups with a
    CSR pointer (``groups.ptr``), by :func:`edge_bam`: the same weights and ``"bam_kl"``."""
    from .aux import add_aux_loss, collecting

    def as_2d(x: Tensor) -> Tensor:  # [num_edges, heads]
        x = x if x.shape == scores.shape else x.expand_as(scores)
        return x.view(-1, 1) if x.dim() == 1 else x

    with_kl = collecting()
    prior_logits = None
    if with_kl and bam.prior_net is not None:
        prior_logits = as_2d(bam._prior_logits(scores, groups, keys, key_index))
    weights, kl = edge_bam(bam, as_2d(scores), groups.ptr, prior_logits, noise=None if noise is None else as_2d(noise),
                           sampling=bam.sampling, with_kl=with_kl)
    if with_kl:
        add_aux_loss("bam_kl", kl)
    return weights if weights.shape == scores.shape else weights.view_as(scores)
