"""Label-smoothed cross-entropy (paper §5.4), summed over the real target tokens.

The smoothed target distribution puts ``1 - eps`` on the reference token and spreads ``eps`` uniformly over the
rest of the vocabulary except padding (fairseq's and tensor2tensor's convention: ``eps / (V - 2)`` on each token that
is neither the reference nor PAD). Positions whose reference is PAD contribute nothing.

The functions return sums, not means: the trainer divides by the number of target tokens of the whole update
(every accumulated batch on every process), so that gradient accumulation and data parallelism give the same
gradient as one big batch.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


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
    vocab = logits.shape[-1]
    lprobs = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab)  # (B*T, V)
    target = target.reshape(-1)  # (B*T,)
    keep = target != pad_id
    lprobs, target = lprobs[keep], target[keep]  # (N, V), (N,)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
    if eps > 0:
        # mass eps/(V-2) on every token but the reference and PAD: subtract those two from the full sum
        others = -(lprobs.sum(dim=1) - lprobs[:, pad_id]) - nll  # (N,) sum of -log p over the non-ref, non-pad tokens
        loss = (1.0 - eps) * nll + eps / (vocab - 2) * others
    else:
        loss = nll
    return loss.sum(), nll.detach().sum(), int(target.numel())
