"""``transduce quickstart``: the whole path in a few minutes on a CPU, with no download.

It writes an embedded corpus (human-readable English dates -> ISO 8601, see :mod:`transduce.data.quickstart`),
prepares it, trains a small Transformer with the paper's recipe for a fixed wall-time budget, evaluates on held-out
pairs (sacreBLEU and exact match), translates a few examples, and draws the encoder-decoder attention of one of
them and the training curves. Everything lands in one output directory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from transduce.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig
from transduce.data.quickstart import SRC_SUFFIX, TGT_SUFFIX, write_corpus
from transduce.search.evaluate import score
from transduce.search.plot import plot_attention_maps, plot_training_curves
from transduce.search.translator import Translator
from transduce.text.textio import read_lines
from transduce.training.train import train

log = logging.getLogger(__name__)

#: the example whose attention is drawn: day and month come first in the source, last in the target
ATTENTION_EXAMPLE = "Tuesday, the 3rd of March, 1998"


@dataclass
class QuickstartResult:
    """What the quickstart measured and wrote."""

    out_dir: Path
    run_dir: Path
    bleu: float
    bleu_signature: str
    exact_match: float  # share of test sources translated exactly right
    test_sentences: int
    steps: int
    examples: list[tuple[str, str, str]] = field(default_factory=list)  # (source, reference, translation)
    attention_png: Path | None = None
    curves_png: Path | None = None

    def to_dict(self) -> dict:
        d = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        d["examples"] = [list(e) for e in self.examples]
        return d


def quickstart_config(out_dir: Path, *, minutes: float, seed: int) -> Config:
    """The run's configuration: a 3+3-layer, d_model 64 model, the paper's optimiser with a short warmup."""
    corpus = out_dir / "corpus"
    return Config(
        model=ModelConfig(encoder_layers=3, decoder_layers=3, d_model=64, d_ff=256, heads=4, dropout=0.1),
        data=DataConfig(
            src_lang=SRC_SUFFIX,
            tgt_lang=TGT_SUFFIX,
            train=str(corpus / "train"),
            valid=str(corpus / "valid"),
            test=[str(corpus / "test")],
            prepared=str(out_dir / "prepared"),
            vocab_size=400,
        ),
        train=TrainConfig(
            run_dir=str(out_dir / "run"),
            seed=seed,
            max_tokens=2048,
            schedule="inverse_sqrt",
            peak_lr=3e-3,
            warmup_steps=300,
            max_minutes=minutes,
            log_every=50,
            valid_every=200,
            valid_max_sentences=300,
            best_metric="bleu",
            keep_last=2,
        ),
        decode=DecodeConfig(beam=4, max_len_a=0.0, max_len_b=16),
    )


def run_quickstart(
    out_dir: str | Path,
    *,
    minutes: float = 2.5,
    seed: int = 1,
    train_pairs: int = 30000,
    test_pairs: int = 1000,
    examples: int = 6,
) -> QuickstartResult:
    """Generate, prepare, train, evaluate, translate and draw; see the module docstring.

    Args:
        out_dir: where the corpus, the prepared data, the run and the pictures go.
        minutes: wall-time budget of the training loop.
        seed: seeds the corpus and the training.
        train_pairs: size of the generated training set.
        test_pairs: size of the held-out test set (the validation set has half as many).
        examples: how many test translations to show.
    """
    out_dir = Path(out_dir)
    log.info("writing the dates corpus (%d training pairs) to %s", train_pairs, out_dir / "corpus")
    write_corpus(out_dir / "corpus", train=train_pairs, valid=max(1, test_pairs // 2), test=test_pairs, seed=seed)
    cfg = quickstart_config(out_dir, minutes=minutes, seed=seed)
    outcome = train(cfg)
    if outcome.exit_code:  # stopped by Ctrl-C (or SIGTERM) with a checkpoint: no results from a model cut short
        raise KeyboardInterrupt

    translator = Translator.load(outcome.run_dir)
    sources = [text for _, text in read_lines(out_dir / "corpus" / f"test.{SRC_SUFFIX}")]
    references = [text for _, text in read_lines(out_dir / "corpus" / f"test.{TGT_SUFFIX}")]
    hypotheses = translator.translate(sources)
    scores = score(hypotheses, references)
    exact = sum(h == r for h, r in zip(hypotheses, references)) / len(references)
    shown = [(s, r, h) for s, r, h in zip(sources, references, hypotheses)][:examples]

    maps = translator.attention(ATTENTION_EXAMPLE)
    attention_png = plot_attention_maps(maps, out_dir / "attention.png")[0]
    curves_png = plot_training_curves(outcome.run_dir / "metrics.jsonl", out_dir / "training_curves.png")
    result = QuickstartResult(
        out_dir=out_dir,
        run_dir=outcome.run_dir,
        bleu=scores.bleu,
        bleu_signature=scores.bleu_signature,
        exact_match=exact,
        test_sentences=len(references),
        steps=outcome.step,
        examples=shown,
        attention_png=attention_png,
        curves_png=curves_png,
    )
    (out_dir / "results.json").write_text(json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n")
    return result
