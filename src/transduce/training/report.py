"""Score a finished run on its validation and test sets, and write a small HTML page about it.

:func:`evaluate_run` translates every validation and test set named in the run's config with the run's model
(an averaged checkpoint when there is one, else the best) and scores each in both conventions: sacreBLEU on cased,
detokenised text (with its signature) and the Multi30k literature's BLEU on lowercased, Moses-tokenised text.
:func:`write_report` turns that, the config and the metrics into ``RUN_DIR/report.html``: one self-contained file
(pictures inlined), no external resources.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from transduce.config import Config
from transduce.data.corpus import Corpus, read_corpus, resolve_corpus, split_name
from transduce.errors import TransduceError
from transduce.search.evaluate import score, score_tokenized_lowercase
from transduce.search.plot import plot_attention_maps, plot_training_curves
from transduce.search.translator import Translator
from transduce.text.textio import read_lines, write_lines
from transduce.training import checkpoint as ckpt
from transduce.training.runlog import read_metrics

log = logging.getLogger(__name__)

EVAL_DIR = "eval"
SCORES_FILE = "scores.json"


def default_model(run_dir: Path) -> Path:
    """The newest averaged checkpoint of the run (``average_last*``), else the run itself (its best checkpoint)."""
    averaged = sorted(
        (p for p in run_dir.glob("average_last*") if (p / ckpt.MANIFEST_FILE).exists()), key=lambda p: p.stat().st_mtime
    )
    return averaged[-1] if averaged else run_dir


def score_both(hypotheses: list[str], references: list[str], lang: str) -> dict[str, Any]:
    """sacreBLEU and chrF on cased, detokenised text and the literature's lowercased, Moses-tokenised BLEU
    (``bleu_lc_tok``), each with its signature."""
    lc = score_tokenized_lowercase(hypotheses, references, lang)
    return {**score(hypotheses, references).to_dict(), "bleu_lc_tok": lc.bleu_lc_tok,
            "bleu_lc_tok_signature": lc.signature}  # fmt: skip


def eval_sets(cfg: Config, tests: list[str] | None = None) -> list[tuple[str, Corpus]]:
    """(name, corpus) of the validation set and every test set of the config, or of ``tests`` in its place (none
    for a multilingual run, whose sets hold several target languages: ``evaluate --tgt-lang`` scores each)."""
    d = cfg.data
    if d.tgt_langs:
        return []
    fields = (d.src_field, d.tgt_field)
    sets = [("valid", resolve_corpus(d.valid, d.src_lang, d.tgt_lang, fields))] if d.valid else []
    for spec in d.test if tests is None else tests:
        corpus = resolve_corpus(spec, d.src_lang, d.tgt_lang, fields)
        sets.append((split_name(spec, corpus), corpus))
    return sets


def evaluate_run(
    run_dir: str | Path, *, model: str | Path | None = None, device: str = "cpu", precision: str = "fp32",
    **decode: Any,
) -> dict[str, Any]:  # fmt: skip
    """Translate and score the run's validation and test sets; write ``RUN_DIR/eval/``.

    Args:
        run_dir: a training run directory.
        model: the checkpoint to evaluate (default: :func:`default_model`).
        device, precision: where and in what dtype to decode (:class:`~transduce.search.translator.Translator`).
        decode: :class:`~transduce.config.DecodeConfig` overrides (``beam=5``, ``length_penalty=1.0``, ...).
    Returns:
        ``{"model": path, "decode": {...}, "sets": {name: {sentences, bleu, bleu_signature, chrf, chrf_signature,
        bleu_lc_tok, bleu_lc_tok_signature}}}``, also written to ``eval/scores.json``.
    """
    run_dir = Path(run_dir)
    cfg = Config.load(run_dir / "config.yaml")
    if cfg.data.tgt_langs:
        raise TransduceError(f"{run_dir}: a model of several target languages ({', '.join(cfg.data.tgt_langs)}): "
                             "score each with transduce evaluate --tgt-lang LANG --src ... --ref ...")  # fmt: skip
    sets = eval_sets(cfg)
    if not sets:
        raise TransduceError(f"{run_dir / 'config.yaml'}: names no data.valid or data.test set to evaluate")
    model_path = Path(model) if model else default_model(run_dir)
    translator = Translator.load(model_path, device, decode=cfg.decode.replace(**decode) if decode else cfg.decode,
                                 precision=precision)  # fmt: skip
    out = run_dir / EVAL_DIR
    out.mkdir(exist_ok=True)
    result: dict[str, Any] = {"model": str(model_path), "decode": translator.decode.to_dict(), "sets": {}}
    lang = cfg.data.tgt_lang
    for name, corpus in sets:
        sources, references = read_corpus(corpus)
        log.info("translating %s (%d sentences) with %s", name, len(sources), model_path)
        hypotheses = translator.translate(sources)
        write_lines(hypotheses, out / f"{name}.hyp.{lang}")
        scores = result["sets"][name] = score_both(hypotheses, references, lang)
        log.info("%s: sacreBLEU %.2f (cased, detokenised) | BLEU %.2f (lowercased, Moses-tokenised)", name,
                 scores["bleu"], scores["bleu_lc_tok"])  # fmt: skip
    (out / SCORES_FILE).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def write_report(
    run_dir: str | Path, *, samples: int = 12, attention_sentences: int = 3, device: str = "cpu",
    precision: str = "fp32",
) -> Path:  # fmt: skip
    """Write ``RUN_DIR/report.html`` from the run's config, metrics and ``eval/`` (run :func:`evaluate_run` first
    for the BLEU table and the samples); the attention maps are computed on ``device`` in ``precision``.

    Returns:
        The page's path.
    """
    run_dir = Path(run_dir)
    cfg = Config.load(run_dir / "config.yaml")
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>transduce run {e(run_dir.name)}</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}img{max-width:100%}"
        "code,pre{background:#f4f4f4}pre{padding:8px;overflow:auto}.sig{font-size:80%;color:#555}",
        "</style></head><body>",
        f"<h1>{e(cfg.data.src_lang)} → {e(cfg.data.tgt_lang)}: {e(str(run_dir))}</h1>",
    ]
    metrics = run_dir / "metrics.jsonl"
    events = read_metrics(metrics) if metrics.exists() else []
    train_events = [ev for ev in events if ev.get("event") == "train"]
    if train_events:
        last = train_events[-1]
        parts.append(f"<p>{last['step']} updates, {last.get('epoch', 0) + 1} epochs.</p>")
    scores_path = run_dir / EVAL_DIR / SCORES_FILE
    scores = json.loads(scores_path.read_text(encoding="utf-8")) if scores_path.exists() else None
    if scores:
        parts.append(f"<h2>Scores</h2><p>Model: <code>{e(scores['model'])}</code>; decoding: "
                     f"<code>{e(json.dumps(scores['decode']))}</code></p>")  # fmt: skip
        parts.append(
            "<table><tr><th>set</th><th>sentences</th><th>sacreBLEU (cased, detokenised)</th><th>chrF</th>"
            "<th>BLEU (lowercased, Moses-tokenised: the Multi30k literature's convention)</th></tr>"
        )
        for name, s in scores["sets"].items():
            parts.append(
                f"<tr><td>{e(name)}</td><td>{s['sentences']}</td>"
                f"<td>{s['bleu']:.2f}<div class=sig>{e(s['bleu_signature'])}</div></td>"
                f"<td>{s['chrf']:.2f}<div class=sig>{e(s['chrf_signature'])}</div></td>"
                f"<td>{s['bleu_lc_tok']:.2f}<div class=sig>{e(s['bleu_lc_tok_signature'])}</div></td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p>No scores yet: run <code>transduce report --evaluate</code>.</p>")
    with tempfile.TemporaryDirectory() as tmp:
        if any(ev.get("event") in ("train", "valid") for ev in events):
            parts.append("<h2>Learning curves</h2>" + _img(plot_training_curves(metrics, Path(tmp) / "curves.png")))
        sets = eval_sets(cfg)
        if scores and sets:
            name, corpus = sets[-1]
            sources, refs = (side[:samples] for side in read_corpus(corpus))
            hyp_file = run_dir / EVAL_DIR / f"{name}.hyp.{cfg.data.tgt_lang}"
            hyps = [t for _, t in read_lines(hyp_file)][:samples]
            parts.append(f"<h2>Sample translations ({e(name)})</h2><table><tr><th>source</th><th>reference</th>"
                         "<th>translation</th></tr>")  # fmt: skip
            parts += [f"<tr><td>{e(s)}</td><td>{e(r)}</td><td>{e(h)}</td></tr>" for s, r, h in zip(sources, refs, hyps)]
            parts.append("</table>")
            translator = Translator.load(scores["model"], device, precision=precision)
            parts.append("<h2>Encoder-decoder attention</h2>")
            for i, source in enumerate(sources[:attention_sentences]):
                png = plot_attention_maps(translator.attention(source), Path(tmp) / f"attention{i}.png")[0]
                parts.append(f"<h3>{e(source)}</h3>{_img(png)}")
    parts.append(f"<h2>Configuration</h2><pre>{e(cfg.to_yaml())}</pre></body></html>")
    page = run_dir / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
