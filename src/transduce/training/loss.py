"""Label-smoothed cross-entropy (paper §5.4), summed over the real target tokens.

The smoothed target distribution puts ``1 - eps`` on the reference token and spreads ``eps`` uniformly over the
rest of the vocabulary except padding (fairseq's and tensor2tensor's convention: ``eps / (V - 2)`` on each token that
is neither the reference nor PAD). Positions whose reference is PAD contribute nothing.

The functions return sums, not means: the trainer divides by the number of target tokens of the whole update
(every accumulated batch on every process), so that gradient accumulation and data parallelism give the same
gradient as one big batch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from transduce import fastpaths
from transduce.model import kernels
from transduce.model.packed import project


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor, int]:
    """Label-smoothed cross-entropy and plain negative log-likelihood, summed over non-pad positions.

    Args:
        logits: (B, T, V) unnormalised scores; computed in float32 whatever their dtype.
        target: (B, T) reference ids, ``pad_id`` where there is no token.
        eps: label smoothing epsilon (0 gives the plain cross-entropy).
        pad_id: the padding id: never a target, and given no smoothing mass.
    Returns:
        ``(loss_sum, nll_sum, n_tokens)``: the smoothed loss and the NLL (for perplexity), each summed over the
        ``n_tokens`` non-pad positions.
    """
    loss, nll = smoothed_nll_sums(logits, target, eps, pad_id)
    return loss, nll, int(target.ne(pad_id).sum())


def smoothed_nll_sums(logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_nll` without the token count, which reads a number back from the device: the
    ``(loss_sum, nll_sum)`` 0-d tensors only (no host synchronisation; the trainer counts tokens on the CPU batch).

    Shape: logits (B, T, V), target (B, T) -> two 0-d float32 tensors.
    """
    vocab = logits.shape[-1]
    target = target.reshape(-1)
    flat = logits.reshape(-1, vocab)
    if _fused_applies(flat, target):
        loss, nll = _FusedSmoothedNLL.apply(flat.contiguous(), target.contiguous(), eps, pad_id)
    else:
        loss, nll = _SmoothedNLL.apply(flat.float(), target, eps, pad_id)
    return loss.sum(), nll.sum()


# The compiled kernel (transduce.model.kernels, csrc/training.cpp) for float32 and bfloat16 logits on the CPU: one
# pass over each row forward and one backward, reading the logits in their own dtype (no float32 copy) and writing
# the gradient in it; _SmoothedNLL (PyTorch's operations) where the kernels do not apply.
def _fused_applies(logits: Tensor, target: Tensor) -> bool:
    return target.dtype == torch.int64 and logits.shape[1] > 2 and kernels.trains(logits)


class _FusedSmoothedNLL(torch.autograd.Function):
    """:class:`_SmoothedNLL`'s function through the compiled kernels: the forward pass keeps the logits (no copy)
    and each row's log-sum-exp; the backward pass writes ``softmax(x) - q`` scaled by the incoming gradient, row by
    row, in the logits' dtype. The same results as :class:`_SmoothedNLL` to float32 rounding (the exponential is a
    polynomial accurate to about two units in the last place); a row with a NaN or +inf logit gets NaN."""

    @staticmethod
    def forward(ctx, x: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
        loss, nll, lse = kernels.compiled().smoothed_nll_forward(x, target, eps, pad_id)
        ctx.save_for_backward(x, lse, target)
        ctx.eps, ctx.pad_id = eps, pad_id
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, None, None, None]:
        x, lse, target = ctx.saved_tensors
        g = grad_loss.float().contiguous()
        return kernels.compiled().smoothed_nll_backward(x, lse, target, g, ctx.eps, ctx.pad_id), None, None, None


class _SmoothedNLL(torch.autograd.Function):
    """Per-position smoothed loss and NLL of (N, V) logits, with the gradient in closed form.

    The forward pass computes the (N, V) log-probabilities with one fused ``log_softmax`` and keeps them; the loss
    needs only their reference entries and row sums. The gradient is ``softmax(x) - q``, ``q`` being the smoothed
    target distribution (``1 - eps`` on the reference, ``eps / (V - 2)`` on every token but the reference and PAD);
    the backward pass writes it over the kept log-probabilities in two in-place passes (``exp``, then one
    multiply-add), with no new (N, V) buffer. Autograd through ``log_softmax``, indexing and ``gather`` would
    materialise and zero-fill several (N, V) tensors instead (about 40% of the loss's time for a 4k-token batch
    and an 8k vocabulary), and the previous closed form (a logsumexp, then ``exp(x - lse)``) made about three more
    passes over (N, V) memory than this one. Positions whose reference is PAD get loss 0 and gradient 0.
    """

    @staticmethod
    def forward(ctx, x: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
        vocab = x.shape[1]
        keep = target.ne(pad_id)
        safe_target = target.masked_fill(~keep, 0)
        lprobs = torch.log_softmax(x, dim=1)  # (N, V), kept for the backward pass
        ref = lprobs.gather(1, safe_target[:, None]).squeeze(1)
        nll = -ref
        if eps > 0:
            # sum of -log p over the V - 2 tokens that are neither the reference nor PAD
            others = ref + lprobs[:, pad_id] - lprobs.sum(dim=1)
            loss = (1.0 - eps) * nll + eps / (vocab - 2) * others
        else:
            loss = nll
        zero = loss.new_zeros(())
        loss, nll = torch.where(keep, loss, zero), torch.where(keep, nll, zero)
        ctx.save_for_backward(lprobs, safe_target, keep)
        ctx.eps, ctx.pad_id = eps, pad_id
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, None, None, None]:
        lprobs, target, keep = ctx.saved_tensors
        eps, pad_id, vocab = ctx.eps, ctx.pad_id, lprobs.shape[1]
        g = torch.where(keep, grad_loss, grad_loss.new_zeros(()))[:, None]  # (N, 1)
        grad = lprobs.exp_()  # softmax(x), over the saved log-probabilities (the graph frees them after this)
        if eps > 0:
            c = eps / (vocab - 2)
            torch.addcmul(g * -c, grad, g, out=grad)  # g * (softmax - q), first as if every token got eps / (V - 2) ...
            grad[:, pad_id] += g[:, 0] * c  # ... then PAD gets nothing
            ref_coef = g * (1.0 - eps - c)  # and the reference 1 - eps
        else:
            grad.mul_(g)
            ref_coef = g
        grad.scatter_add_(1, target[:, None], -ref_coef)
        # padded positions, whatever their logits (even non-finite); unconditionally: asking whether there are any
        # would wait for the device
        grad.masked_fill_(~keep[:, None], 0.0)
        return grad, None, None, None


def output_loss_sums(
    output: nn.Module, states: Tensor, target: Tensor, eps: float, pad_id: int, *, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor]:
    """The pre-softmax projection of the decoder's ``states`` and :func:`smoothed_nll_sums` of its logits:
    ``smoothed_nll_sums(output(states), target, eps, pad_id)``, the logits in ``dtype`` (``None``: the dtype the
    projection gives, that is bf16 under a bf16 autocast).

    Where :func:`blocked_output_applies` (training on the CPU with the kernels, ``fastpaths.settings.
    output_loss_rows`` > 0), the product and the loss run by blocks of rows through :class:`_BlockedOutputLoss`
    instead: the same values (to the products' rounding), the (N, V) logits never kept.

    Shapes: output a ``nn.Linear`` (d -> V), states (B, T, d), target (B, T) -> two 0-d float32 tensors.
    """
    if blocked_output_applies(output, states, target, dtype):
        rows = fastpaths.settings.output_loss_rows
        d = states.shape[-1]
        compute = dtype or (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else states.dtype)
        return _BlockedOutputLoss.apply(
            states.reshape(-1, d), output.weight, output.bias, target.reshape(-1), eps, pad_id, compute, rows
        )
    logits = project(output, states, output=True)
    return smoothed_nll_sums(logits if dtype is None else logits.to(dtype), target, eps, pad_id)


def blocked_output_applies(output: nn.Module, states: Tensor, target: Tensor, dtype: torch.dtype | None) -> bool:
    """Whether :func:`output_loss_sums` takes the blocked path: ``output_loss_rows`` > 0, a plain ``nn.Linear``, a
    float32 or bf16 computation on the CPU with the kernels, int64 targets, and gradients wanted (training)."""
    if fastpaths.settings.output_loss_rows <= 0 or type(output) is not nn.Linear or target.dtype != torch.int64:
        return False
    compute = dtype or (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else states.dtype)
    wanted = torch.is_grad_enabled() and (states.requires_grad or output.weight.requires_grad)
    return (
        wanted and compute in (torch.float32, torch.bfloat16) and states.dtype == output.weight.dtype == torch.float32
        and states.device.type == "cpu" and output.out_features > 2 and kernels.compiled() is not None
    )  # fmt: skip


class _BlockedOutputLoss(torch.autograd.Function):
    """The pre-softmax projection and the label-smoothed loss of (N, d) states, ``rows`` rows at a time.

    A product of a few thousand rows with an 8k vocabulary writes logits far larger than the caches, and oneDNN's
    bf16 product ran it at 153 GFLOP/s on a Xeon with AMX where blocks of 256-512 rows ran at 430-485 (one thread).
    So the forward pass takes a block of rows at a time: its logits (``mm`` into a slice of one (N, V) buffer), then
    the loss kernel in one pass over each row (``smoothed_nll_unit_grad_``: the loss and NLL of the row, and its
    gradient for a unit incoming gradient, ``softmax - q``, written over the row's logits while they are in the
    cache). With the whole (N, V) gradient written, two products
    give the states' and the weight's gradients (the weight's is one product over all N rows, where the blocks would
    be too thin) and the buffer is freed; the backward pass only scales them by the incoming gradient of the summed
    loss. The products run in ``dtype`` (the states and weight cast once, as autocast would), their gradients are
    returned in float32.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, target, eps, pad_id, dtype, rows):  # type: ignore[override]
        compiled = kernels.compiled()
        with torch.autocast("cpu", enabled=False):
            x, w = h.to(dtype).contiguous(), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            n, vocab = x.shape[0], w.shape[0]
            grad = torch.empty(n, vocab, dtype=dtype)  # each block's logits, then their gradient
            loss, nll = torch.empty(n), torch.empty(n)
            target = target.contiguous()
            wt = w.t()
            for i in range(0, n, rows):
                j = min(n, i + rows)
                block = grad[i:j]
                if b is None:
                    torch.mm(x[i:j], wt, out=block)
                else:
                    torch.addmm(b, x[i:j], wt, out=block)
                # the loss of each row, and softmax - q written over the block's logits
                loss[i:j], nll[i:j] = compiled.smoothed_nll_unit_grad_(block, target[i:j], eps, pad_id)
            need_h, need_w, need_b = ctx.needs_input_grad[:3]
            grad_h = grad @ w if need_h else None  # (N, d)
            grad_w = grad.t() @ x if need_w else None  # (V, d)
            grad_b = grad.sum(dim=0, dtype=torch.float32) if need_b and b is not None else None
        ctx.grads = (grad_h, grad_w, grad_b)
        ctx.mark_non_differentiable(nll)
        return loss.sum(), nll.sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):  # type: ignore[override]
        g = grad_loss.float()
        grads = [None if x is None else x.float() * g for x in ctx.grads]
        ctx.grads = None
        return *grads, None, None, None, None, None
