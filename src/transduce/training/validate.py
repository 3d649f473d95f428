"""Validation during training: loss and perplexity with teacher forcing, BLEU by decoding.

BLEU references are the raw validation target lines (the file recorded in the prepared manifest, normalised the
way the tokenizer normalises its input, e.g. lowercased when ``data.lowercase``); when that file is gone, the
decoded reference ids stand in (the log says so). Hypotheses are decoded greedily when ``train.valid_beam`` is 1,
else by beam search with the other settings of the ``decode`` section. sacreBLEU's signature is logged with the score.

With data parallelism every rank handles a strided share of the sentences and the results are combined, so the
numbers do not depend on the number of processes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.distributed as tdist
from torch import Tensor

from transduce.config import Config
from transduce.data import ParallelDataset, TokenBatchSampler, collate, read_lines, read_manifest
from transduce.data.corpus import corpora_of_record, read_corpus
from transduce.text.tokenizer import Vocabulary
from transduce.training.distributed import Dist, all_reduce_sum
from transduce.training.loss import label_smoothed_nll


@dataclasses.dataclass
class ValidResult:
    """One validation. ``bleu`` and its signatures are None when BLEU was not computed."""

    loss: float  # label-smoothed loss per target token
    nll: float  # negative log-likelihood per target token
    ppl: float  # exp(nll)
    tokens: int
    bleu: float | None = None
    bleu_signature: str | None = None
    chrf: float | None = None
    chrf_signature: str | None = None
    sentences: int = 0  # sentences decoded for BLEU
    references: str = ""  # "raw" or "decoded ids"
    accuracy: float | None = None  # a classifier's: the percentage of examples whose best-scored label is theirs

    def metric(self, name: str) -> float:
        """The value compared by ``best_metric``, oriented so that higher is better."""
        if name == "bleu" and self.bleu is not None:
            return self.bleu
        if name == "accuracy" and self.accuracy is not None:
            return self.accuracy
        return -self.loss

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def special_ids(config: Config) -> tuple[int, int, int]:
    """``(pad, bos, eos)`` of the model, for :func:`collate` (an imported Marian model has its own)."""
    return config.model.pad_id, config.model.bos_id, config.model.eos_id


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module, dataset: ParallelDataset, config: Config, device: torch.device, dist: Dist, autocast
) -> tuple[float, float, int]:
    """Teacher-forced ``(loss, nll, tokens)`` per target token over the whole split (combined over ranks)."""
    model.eval()
    sampler = TokenBatchSampler(
        dataset.src_lengths, dataset.tgt_lengths, config.train.max_tokens, seed=0, shuffle=False,
        rank=dist.rank, world_size=dist.world_size,
    )  # fmt: skip
    loss_sum = nll_sum = 0.0
    tokens = 0
    for indices in sampler.iter_from(0):
        batch = collate([dataset[i] for i in indices], *special_ids(config)).to(device)
        with autocast():
            logits = model(batch.src, batch.tgt_in)
        loss, nll, n = label_smoothed_nll(logits, batch.tgt_out, config.train.label_smoothing, config.model.pad_id)
        loss_sum, nll_sum, tokens = loss_sum + loss.item(), nll_sum + nll.item(), tokens + n
    loss_sum, nll_sum, total = all_reduce_sum([loss_sum, nll_sum, float(tokens)], device)
    total = max(total, 1.0)
    return loss_sum / total, nll_sum / total, int(total)


def label_validation(
    outputs: Iterable[tuple[Tensor, Tensor]], loss_sums: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    device: torch.device,
) -> ValidResult:  # fmt: skip
    """Loss, negative log-likelihood and accuracy per label of a model that predicts one label per example (a
    classifier's class, a masked language model's original piece at a chosen position), every rank's share combined.

    Args:
        outputs: this rank's ``(logits, labels)`` batches, logits ``(N, C)`` and labels ``(N,)``.
        loss_sums: ``(loss_sum, nll_sum)`` of a batch's logits and labels, as 0-d tensors.

    Returns:
        ``tokens``: the labels counted; ``accuracy``: the percentage of them that are the best-scored.
    """
    loss_sum = nll_sum = correct = count = 0.0
    for logits, labels in outputs:
        loss, nll = loss_sums(logits, labels)
        loss_sum += loss.item()
        nll_sum += nll.item()
        correct += float((logits.argmax(dim=-1) == labels).sum())
        count += len(labels)
    loss_sum, nll_sum, correct, count = all_reduce_sum([loss_sum, nll_sum, correct, count], device)
    n = max(count, 1.0)
    return ValidResult(loss=loss_sum / n, nll=nll_sum / n, ppl=math.exp(min(nll_sum / n, 100.0)), tokens=int(count),
                       accuracy=100.0 * correct / n)  # fmt: skip


def read_references(dataset: ParallelDataset, tokenizer: Vocabulary) -> tuple[list[str], str]:
    """Reference sentences of the split: raw lines (normalised) when the raw file exists, else decoded ids."""
    try:
        parts = corpora_of_record(read_manifest(dataset.directory)["inputs"][dataset.split])
    except KeyError:
        parts = []
    if parts and all(corpus.tgt.exists() for corpus in parts):
        # the rule prepare follows for validation lines (kept with U+FFFD when data.skip_invalid_utf8, else they
        # never got past prepare): every line stays, so line_index still points at the right one (several target
        # languages' files: their lines one after the other, as prepare numbers them)
        lines: list[str] = []
        for corpus in parts:
            if corpus.single_file:  # a TSV or JSON Lines file: the target side of each line
                lines += read_corpus(corpus, errors="replace")[1]
            else:
                lines += [line for _, line in read_lines(corpus.tgt, errors="replace")]
        return [tokenizer.normalise(lines[int(i)]) for i in dataset.line_index], "raw"
    return [tokenizer.decode_tgt(dataset[i][1].tolist()) for i in range(len(dataset))], "decoded ids"


@torch.no_grad()
def validation_translations(
    model: torch.nn.Module, dataset: ParallelDataset, tokenizer: Vocabulary, config: Config, device: torch.device,
    dist: Dist, limit: int = 0,
) -> list[str]:  # fmt: skip
    """Greedy/beam translations of the first ``limit`` sentences (0: all), in dataset order, on rank 0 (others: [])."""
    from transduce.search import generate, length_batches

    model.eval()
    n = min(limit, len(dataset)) if limit else len(dataset)
    mine = np.arange(dist.rank, n, dist.world_size)
    decode_cfg = config.decode.replace(beam=config.train.valid_beam, nbest=1, sampling=False)
    width = decode_cfg.beam  # hypotheses per sentence in the search: the budget counts sentences x beam x length
    out: dict[int, str] = {}
    for indices in length_batches((dataset.src_lengths[mine] + 1).tolist(), decode_cfg.max_tokens, width):
        chunk = mine[indices]  # similar lengths share a batch
        src = collate([(dataset[int(i)][0], np.zeros(0, np.int64)) for i in chunk], *special_ids(config)).src.to(device)
        for i, hyps in zip(chunk, generate(model, src, decode_cfg)):
            out[int(i)] = tokenizer.decode_tgt(hyps[0].tokens)
    if dist.enabled:
        gathered: list[dict[int, str] | None] = [None] * dist.world_size
        tdist.all_gather_object(gathered, out)
        out = {k: v for part in gathered if part for k, v in part.items()}
    return [out[i] for i in range(n)] if dist.is_main else []


def validate(
    model: torch.nn.Module, dataset: ParallelDataset, tokenizer: Vocabulary | None, references: list[str] | None,
    reference_kind: str, config: Config, device: torch.device, dist: Dist, autocast,
) -> ValidResult:  # fmt: skip
    """Loss, perplexity and (when ``train.valid_bleu`` and a tokenizer are given) BLEU and chrF on rank 0."""
    loss, nll, tokens = validation_loss(model, dataset, config, device, dist, autocast)
    result = ValidResult(loss=loss, nll=nll, ppl=math.exp(min(nll, 100.0)), tokens=tokens)
    if config.train.valid_bleu and tokenizer is not None:  # every rank decodes its share; rank 0 has the references
        from transduce.search.evaluate import score

        limit = config.train.valid_max_sentences
        hyps = validation_translations(model, dataset, tokenizer, config, device, dist, limit)
        if dist.is_main:
            assert references is not None
            scores = score(hyps, references[: len(hyps)])
            result.bleu, result.bleu_signature = float(scores.bleu), str(scores.bleu_signature)
            result.chrf, result.chrf_signature = float(scores.chrf), str(scores.chrf_signature)
            result.sentences, result.references = len(hyps), reference_kind
    return result
