"""Attention heatmaps (matplotlib, Agg backend): one panel per layer and head, the per-layer head average, and the
average over everything, with the subword pieces on the axes.

    maps = translator.attention("A man on a bike.")
    plot_attention_maps(maps, "attention.png", self_attention=True)   # attention.png, .encoder.png, .decoder.png
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from transduce.files import replaced_on_success

if TYPE_CHECKING:
    from transduce.search.translator import AttentionMaps


def plot_attention(
    weights: torch.Tensor, x_labels: list[str], y_labels: list[str], path: str | Path, *, title: str = ""
) -> Path:
    """Write a PNG grid of attention heatmaps.

    Rows are layers; columns are the heads and then the layer's mean over heads; a last row holds the mean over all
    layers and heads. Rows of a panel are queries (``y_labels``), columns keys (``x_labels``).

    Args:
        weights: (layers, heads, Tq, Tk) attention probabilities.
        x_labels: Tk key labels.
        y_labels: Tq query labels.
        path: the PNG to write (parent directories are created).
        title: figure title.
    Returns:
        ``path`` as a :class:`Path`.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # the object API: no global pyplot state, safe in threads

    layers, heads, tq, tk = weights.shape
    if (tq, tk) != (len(y_labels), len(x_labels)):
        raise ValueError(f"weights are {tq}x{tk} but there are {len(y_labels)}x{len(x_labels)} labels")
    w = weights.detach().float().cpu()
    cols, rows = heads + 1, layers + 1
    panel_w, panel_h = max(2.2, 0.22 * tk + 0.9), max(2.0, 0.22 * tq + 0.7)
    fig = Figure(figsize=(cols * panel_w, rows * panel_h + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    font = 7 if max(tq, tk) <= 30 else 5

    def draw(ax, data: torch.Tensor, label: str) -> None:
        ax.imshow(data.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(label, fontsize=8)
        ax.set_xticks(range(tk), x_labels, rotation=90, fontsize=font)
        ax.set_yticks(range(tq), y_labels, fontsize=font)

    for layer in range(layers):
        for head in range(heads):
            draw(axes[layer][head], w[layer, head], f"layer {layer + 1} head {head + 1}")
        draw(axes[layer][heads], w[layer].mean(dim=0), f"layer {layer + 1} mean")
    draw(axes[layers][0], w.mean(dim=(0, 1)), "mean of all layers and heads")
    for ax in axes[layers][1:]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    with replaced_on_success(path) as tmp:  # the picture appears only when complete (its directory made for it)
        fig.savefig(tmp, dpi=110)  # the temporary name keeps the suffix that chooses the format
    return path


def plot_attention_maps(maps: AttentionMaps, path: str | Path, *, self_attention: bool = False) -> list[Path]:
    """Encoder-decoder attention into ``path``; with ``self_attention`` also the encoder self-attention into
    ``<stem>.encoder.png`` and the decoder self-attention into ``<stem>.decoder.png`` beside it.

    Returns:
        The files written.
    """
    path = Path(path)
    src, tgt_in, tgt_out = maps.src_pieces, maps.tgt_in_pieces, maps.tgt_out_pieces
    written = [plot_attention(maps.cross, src, tgt_out, path, title="encoder-decoder attention (row: predicted token)")]
    if self_attention:
        written.append(
            plot_attention(maps.encoder, src, src, path.with_suffix(".encoder.png"), title="encoder self-attention")
        )
        written.append(
            plot_attention(
                maps.decoder,
                tgt_in,
                tgt_out,
                path.with_suffix(".decoder.png"),
                title="decoder self-attention (row: predicted token, column: decoder input)",
            )
        )
    return written


def plot_training_curves(metrics: str | Path, path: str | Path) -> Path:
    """Training and validation loss against updates, and validation BLEU when it was computed, from a run's
    ``metrics.jsonl``.

    Returns:
        ``path`` as a :class:`Path`.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    from transduce.training.runlog import read_metrics

    train = read_metrics(metrics, "train")
    valid = read_metrics(metrics, "valid")
    with_bleu = [v for v in valid if "bleu" in v]
    fig = Figure(figsize=(10 if with_bleu else 5.5, 3.6), layout="constrained")
    axes = fig.subplots(1, 2 if with_bleu else 1, squeeze=False)[0]
    ax = axes[0]
    ax.plot([e["step"] for e in train], [e["loss"] for e in train], label="training loss", linewidth=1)
    if valid:
        ax.plot([e["step"] for e in valid], [e["loss"] for e in valid], "o-", label="validation loss", markersize=3)
    ax.set_xlabel("update")
    ax.set_ylabel("label-smoothed loss per token")
    ax.legend()
    ax.grid(alpha=0.3)
    if with_bleu:
        ax = axes[1]
        ax.plot([e["step"] for e in with_bleu], [e["bleu"] for e in with_bleu], "o-", color="C2", markersize=3)
        ax.set_xlabel("update")
        ax.set_ylabel("validation BLEU")
        ax.grid(alpha=0.3)
    path = Path(path)
    with replaced_on_success(path) as tmp:  # the picture appears only when complete (its directory made for it)
        fig.savefig(tmp, dpi=110)  # the temporary name keeps the suffix that chooses the format
    return path
