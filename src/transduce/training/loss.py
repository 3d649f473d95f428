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
from torch import Tensor
from torch.autograd.function import once_differentiable

from transduce.model import kernels


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
