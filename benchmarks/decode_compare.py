"""Decoding speed and quality of one model across decoders: transduce (float32, bf16 products and dynamic int8),
Hugging Face ``MarianMTModel.generate`` (post-norm models only) and CTranslate2 (float32, int8, and int16, bfloat16
and int8_bfloat16 where its CPU build offers them; else a line says it is left out), all with the same weights
(exported by ``transduce.interop``), on the same sentences in the same batches, measured side by side in one run.

    python benchmarks/decode_compare.py --model runs/m30k_en_de_r1 \\
        --src ../shared/data/multi30k/test_2016_flickr.en.gz --ref ../shared/data/multi30k/test_2016_flickr.de.gz
    python benchmarks/decode_compare.py --random small --sentences 500     # random weights, synthetic sources

Sentences are sorted by length and cut into batches of ``--batch`` sentences (every decoder gets the same batches).
Each decoder stops a hypothesis at EOS or at source length + 50 tokens. For every mode (greedy, beam 4), batch size
and decoder it prints sentences/s and output tokens/s (median of ``--reps``), the speed ratio to CTranslate2
float32, and with ``--ref`` the BLEU of the output (sacreBLEU on detokenised text, and lowercased Moses-tokenised
BLEU when the model is lowercased). Threads: torch and CTranslate2 both use ``torch.get_num_threads()``. A
repetition goes through the batches in turn, every decoder translating a batch before any goes on to the next (in
a rotating order), so that a slow moment of a shared machine falls on all decoders rather than on one whole run.

Variants of transduce's fast paths, for comparisons on one CPU (not in the default list): ``ours-onednn-layers``
(fp32 with oneDNN for every linear layer), ``ours-bf16-fallback`` (bf16 products through ``F.linear``),
``ours-bf16-cast`` (the whole model cast to bf16, the kernels then off), ``ours-linear-early`` (fp32 through
``F.linear`` with oneDNN's packed output layer, without transposed weight copies), ``ours-packed-output-early``
(oneDNN's packed output layer, transposed copies for the other layers), ``ours-bf16-all-early`` (bf16
products for every layer, whatever its size), ``ours-bf16-onednn-early`` (bf16 products through oneDNN, not
transduce's AMX kernel: the layers of at least ``bf16_min_weights`` weights), ``ours-copied-early`` and
``ours-by-position-early`` (the step's self-attention cache copied into row order at every step, or stored by
position, whatever the source's length; ``ours-bf16-copied-early``, ``ours-bf16-by-position-early`` the same in
bf16), ``ours-bf16-unfused-early`` and ``ours-int8-unfused-early`` (the logits written, then the candidates
taken from them: not the AMX kernels' one pass) and ``ours-int8-vnni`` (int8 through transduce's VNNI kernel
alone, not in the AMX tiles where the CPU has them); ``ours-bf16-early`` and ``ours-int8-vnni-early`` with
CTranslate2's stopping rule.

Stopping rules: CTranslate2 (patience 1) stops a sentence once it has ``beam`` finished hypotheses; transduce by
default stops only when no live hypothesis can beat them (more steps), and with ``early_stopping`` as CTranslate2
does: the ``-early`` decoders (beam search only). Length penalties: transduce uses GNMT's ((5 + |Y|) / 6) ** 0.6
by default, Hugging Face and CTranslate2 divide by |Y| ** 1 (their default); ``--length-norm length
--length-penalty 1.0`` gives transduce theirs, so that ``ours-early`` decodes by CTranslate2's rules exactly (the
same n-best lists and scores, ``tests/test_interop.py``). Speed hardly depends on it; BLEU is reported per decoder.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from harness import add_common_args, apply_common_args, interleaved_pieces, machine, table
from transduce import fastpaths
from transduce.config import DecodeConfig, ModelConfig
from transduce.search import generate
from transduce.search.common import pad_sequences
from transduce.search.evaluate import score, score_tokenized_lowercase
from transduce.search.translator import Translator
from transduce.text.textio import read_lines

MAX_EXTRA = 50  # output length limit: source length + 50, as the paper


class Ours:
    def __init__(self, translator: Translator, name: str, decode: DecodeConfig, paths: dict | None = None) -> None:
        self.tr, self.name, self.decode, self.paths = translator, name, decode, paths or {}

    @property
    def early_stopping(self) -> bool:
        return self.decode.early_stopping

    def run(self, batches: list[list[list[int]]], beam: int) -> list[list[int]]:
        c = self.tr.model.config
        cfg = self.decode.replace(beam=beam)
        out = []
        with fastpaths.override(**self.paths):  # (the fast-path variants: their settings for their runs only)
            for batch in batches:
                src = pad_sequences([[*ids, c.eos_id] for ids in batch], c.pad_id)
                out += [hyps[0].tokens for hyps in generate(self.tr.model, src, cfg)]
        return out


class HF:
    name = "HF generate"

    def __init__(self, export_dir: Path, pad_id: int) -> None:
        import transformers

        self.model = transformers.MarianMTModel.from_pretrained(str(export_dir)).eval()
        self.pad_id = pad_id

    def run(self, batches: list[list[list[int]]], beam: int) -> list[list[int]]:
        cfg = self.model.config
        out = []
        with torch.inference_mode():
            for batch in batches:
                src = pad_sequences([[*ids, cfg.eos_token_id] for ids in batch], self.pad_id)
                gen = self.model.generate(
                    input_ids=src, attention_mask=src.ne(self.pad_id).long(), num_beams=beam, do_sample=False,
                    max_new_tokens=max(map(len, batch)) + MAX_EXTRA + 1,
                )  # fmt: skip
                for row in gen.tolist():
                    toks = []
                    for t in row[1:]:
                        if t == cfg.eos_token_id:
                            break
                        toks.append(t)
                    out.append(toks)
        return out


class CT2:
    def __init__(self, model_dir: Path, tokenizer, name: str, compute_type: str = "default") -> None:
        import ctranslate2

        self.name, self.tok = name, tokenizer
        threads = torch.get_num_threads()
        self.translator = ctranslate2.Translator(
            str(model_dir), device="cpu", intra_threads=threads, inter_threads=1, compute_type=compute_type
        )
        self.vocab = {p: i for i, p in enumerate(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))}

    def run(self, batches: list[list[list[int]]], beam: int) -> list[list[int]]:
        out = []
        for batch in batches:
            pieces = [self.tok.src_pieces(ids) for ids in batch]
            results = self.translator.translate_batch(
                pieces, beam_size=beam, max_decoding_length=max(map(len, batch)) + MAX_EXTRA + 1,
                min_decoding_length=0,  # as our min_len (CTranslate2's default of 1 bars EOS at the first step)
                max_batch_size=len(batch),
            )  # fmt: skip
            out += [[self.vocab[p] for p in r.hypotheses[0]] for r in results]
        return out


def load_inputs(args, translator: Translator) -> tuple[list[list[int]], list[str] | None]:
    if args.src:
        lines = [text for _, text in read_lines(args.src)][: args.sentences or None]
        ids = translator.tokenizer.encode_src_batch(lines)
        refs = [text for _, text in read_lines(args.ref)][: len(lines)] if args.ref else None
        return ids, refs
    g = torch.Generator().manual_seed(args.seed)
    vocab = translator.model.config.src_vocab_size
    lengths = torch.randint(5, 41, (args.sentences,), generator=g).tolist()
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths], None


def random_translator(preset: str, vocab_dir: Path) -> Translator:
    """A random ``preset`` model with a throwaway SentencePiece vocabulary of 8000 pieces (trained on synthetic
    text), so that every decoder, CTranslate2 included, sees real pieces."""
    import random

    from transduce.model import Transformer
    from transduce.text.tokenizer import Tokenizer

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(20000)]
    text = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(20000)]
    tok = Tokenizer.train(vocab_dir, text, vocab_size=8000)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset(preset, src_vocab_size=8000, tgt_vocab_size=8000)).eval()
    return Translator(model, tok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="run directory or checkpoint (else --random)")
    ap.add_argument("--random", default="small", help="preset of a random model when --model is not given")
    ap.add_argument("--src", help="source text (plain or .gz); default: synthetic sentences")
    ap.add_argument("--ref", help="reference text for BLEU")
    ap.add_argument("--sentences", type=int, default=0, help="first N sentences (0: all; synthetic: 500)")
    ap.add_argument("--batches", default="32,64")
    ap.add_argument("--modes", default="greedy,beam4")
    ap.add_argument(
        "--decoders",
        default="ours,ours-early,ours-bf16,ours-int8,ours-int8-early,hf,ct2,ct2-int16,ct2-bf16,ct2-int8,ct2-int8-bf16",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--length-penalty", type=float, default=0.6, help="transduce's alpha (default: the paper's 0.6)")
    ap.add_argument("--length-norm", default="gnmt", help="transduce's penalty: gnmt or length (|Y| ** alpha)")
    add_common_args(ap, reps=3)
    args = ap.parse_args()
    apply_common_args(args)
    if not args.src and not args.sentences:
        args.sentences = 500

    from transduce.interop import quiet_transformers
    from transduce.interop.ctranslate2 import export_ctranslate2
    from transduce.interop.marian import export_hf, export_problems
    from transduce.model.quantize import quantize_int8

    quiet_transformers()
    work = Path(tempfile.mkdtemp(prefix="decode-compare-"))
    if args.model:
        source = args.model
        translator = Translator.load(source)
    else:
        translator = random_translator(args.random, work / "vocab")
        from transduce.config import Config
        from transduce.training.checkpoint import save_model

        source = save_model(work / "model", translator.model, Config(model=translator.model.config), work / "vocab")
    tok = translator.tokenizer
    wanted = args.decoders.split(",")
    decoders = []
    int8 = Translator(quantize_int8(translator.model), tok, translator.decode) if "int8" in wanted_any(wanted) else None
    bf16 = None
    # bf16 products, the rest float32 (model/bf16.py)
    if any(
        name.startswith("ours-bf16") and name not in ("ours-bf16-all-early", "ours-bf16-onednn-early", "ours-bf16-cast")
        for name in wanted
    ):
        bf16 = Translator(translator.model, tok, translator.decode, precision="bf16")
    bf16_onednn = None
    if "ours-bf16-onednn-early" in wanted:  # oneDNN's bf16 products (layers of at least bf16_min_weights weights)
        with fastpaths.override(bf16_amx=False):
            bf16_onednn = Translator(translator.model, tok, translator.decode, precision="bf16")
    bf16_all = None
    if "ours-bf16-all-early" in wanted:  # bf16 products for every linear layer, whatever its size
        with fastpaths.override(bf16_min_weights=0):
            bf16_all = Translator(translator.model, tok, translator.decode, precision="bf16")
    cast = None
    if "ours-bf16-cast" in wanted:  # the whole model in bf16 (what precision bf16 means on a GPU)
        cast = Translator(copy.deepcopy(translator.model).to(torch.bfloat16), tok, translator.decode)
    linear_paths = {"transposed_weights": False, "onednn": fastpaths.onednn_available()}  # no transposed copies
    packed = {"onednn": fastpaths.onednn_available()}  # oneDNN's packed output layer, transposed copies elsewhere
    copied = {"by_position_min_source": 1 << 30}  # the self-attention cache copied into row order at every step
    by_position = {"by_position_min_source": 0}  # ... or stored by position, whatever the source's length
    unfused = {"fused_candidates": False}  # the logits written, then the candidates taken from them
    for name, tr, label, early, paths in [
        ("ours", translator, "transduce fp32", False, None),
        ("ours-copied-early", translator, "transduce fp32, cache copied, early stopping", True, copied),
        ("ours-by-position-early", translator, "transduce fp32, cache by position, early stopping", True, by_position),
        ("ours-early", translator, "transduce fp32, early stopping", True, None),
        ("ours-onednn-layers", translator, "transduce fp32, oneDNN for every layer", False, {"onednn_layers": True}),
        ("ours-linear-early", translator, "transduce fp32, F.linear, early stopping", True, linear_paths),
        ("ours-packed-output-early", translator, "transduce fp32, oneDNN output layer, early stopping", True, packed),
        ("ours-bf16-all-early", bf16_all, "transduce bf16 for every layer, early stopping", True, None),
        ("ours-bf16", bf16, "transduce bf16", False, None),
        ("ours-bf16-early", bf16, "transduce bf16, early stopping", True, None),
        ("ours-bf16-copied-early", bf16, "transduce bf16, cache copied, early stopping", True, copied),
        ("ours-bf16-by-position-early", bf16, "transduce bf16, cache by position, early stopping", True, by_position),
        (
            "ours-bf16-unfused-early",
            bf16,
            "transduce bf16, logits written, early stopping",
            True,
            unfused,
        ),
        (
            "ours-bf16-onednn-early",
            bf16_onednn,
            "transduce bf16, oneDNN products, early stopping",
            True,
            {"bf16_amx": False},
        ),
        (
            "ours-bf16-fallback",
            bf16,
            "transduce bf16, F.linear products",
            False,
            {"bf16_onednn": False, "bf16_amx": False},
        ),
        ("ours-bf16-cast", cast, "transduce, whole model cast to bf16", False, None),
        ("ours-int8", int8, "transduce int8", False, None),
        ("ours-int8-early", int8, "transduce int8, early stopping", True, None),
        ("ours-int8-unfused-early", int8, "transduce int8, logits written, early stopping", True, unfused),
        ("ours-int8-vnni", int8, "transduce int8, VNNI kernel only", False, {"int8_amx": False}),
        ("ours-int8-vnni-early", int8, "transduce int8, VNNI kernel only, early stopping", True, {"int8_amx": False}),
    ]:
        if name in wanted:
            decode = DecodeConfig(
                max_len_a=1.0, max_len_b=MAX_EXTRA, early_stopping=early, length_penalty=args.length_penalty,
                length_norm=args.length_norm,
            )  # fmt: skip
            decoders.append(Ours(tr, label, decode, paths))
    if "hf" in wanted:
        problems = export_problems(translator.model.config)
        if problems:
            print(f"HF generate left out: {'; '.join(problems)}")
        else:
            decoders.append(HF(export_hf(source, work / "hf"), translator.model.config.pad_id))
    if "ct2" in wanted:
        decoders.append(CT2(export_ctranslate2(source, work / "ct2"), tok, "CTranslate2 fp32"))
    if "ct2-int8" in wanted:
        decoders.append(
            CT2(export_ctranslate2(source, work / "ct2-int8", quantization="int8"), tok, "CTranslate2 int8")
        )
    # CTranslate2's bf16 compute types, where its CPU build offers them (its float32 model, converted on loading)
    offered = ctranslate2_compute_types()
    for name, compute_type, label in [
        ("ct2-int16", "int16", "CTranslate2 int16"),
        ("ct2-bf16", "bfloat16", "CTranslate2 bf16"),
        ("ct2-int8-bf16", "int8_bfloat16", "CTranslate2 int8_bfloat16"),
    ]:
        if name not in wanted:
            continue
        if compute_type not in offered:
            print(f"{label} left out: this CTranslate2's CPU build offers {', '.join(sorted(offered))}")
            continue
        export = work / "ct2" if (work / "ct2").exists() else export_ctranslate2(source, work / "ct2")
        decoders.append(CT2(export, tok, label, compute_type))

    ids, refs = load_inputs(args, translator)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    lowercase = bool(getattr(tok, "lowercase", False))
    print(machine())
    print(f"model {source}: {translator.model.num_parameters():,} parameters; {len(ids)} sentences; "
          f"median of {args.reps}; transduce's length penalty: {args.length_norm}, "
          f"alpha {args.length_penalty}\n")  # fmt: skip

    rows = []
    for mode in args.modes.split(","):
        beam = 1 if mode == "greedy" else int(mode.removeprefix("beam"))
        for bs in map(int, args.batches.split(",")):
            batches = [[ids[i] for i in order[k : k + bs]] for k in range(0, len(order), bs)]
            outputs: dict[str, list[list[int]]] = {}
            active = [d for d in decoders if beam > 1 or not getattr(d, "early_stopping", False)]  # greedy: the same

            def run(d, i: int, batches=batches, beam=beam, outputs=outputs) -> None:
                outputs.setdefault(d.name, [[] for _ in batches])[i] = d.run([batches[i]], beam)

            # interleaved batch by batch, so that a noisy moment hits every decoder alike
            for d in active:  # (one untimed batch each first: kernels built, weights packed, caches warm)
                run(d, 0)
            times = interleaved_pieces({d.name: lambda i, d=d: run(d, i) for d in active}, len(batches), args.reps)
            outputs = {name: [o for part in parts for o in part] for name, parts in outputs.items()}
            base = statistics.median(times["CTranslate2 fp32"]) if "CTranslate2 fp32" in times else None
            for d in active:
                t = statistics.median(times[d.name])
                n_tok = sum(len(o) + 1 for o in outputs[d.name])  # + EOS
                bleu = lc = "-"
                if refs is not None:
                    hyps = [""] * len(ids)
                    for pos, i in enumerate(order):
                        hyps[i] = tok.decode_tgt(outputs[d.name][pos])
                    bleu = f"{score(hyps, refs).bleu:.2f}"
                    if lowercase:
                        lc = f"{score_tokenized_lowercase(hyps, refs, translator_lang(args)).bleu_lc_tok:.2f}"
                ratio = f"{base / t:.2f}x" if base else "-"
                rows.append((mode, bs, d.name, f"{len(ids) / t:.1f}", f"{n_tok / t:.0f}", ratio, bleu, lc))
            print(f"{mode}, batch {bs}: done", file=sys.stderr, flush=True)
    header = ("mode", "batch", "decoder", "sent/s", "output tok/s", "vs CTranslate2 fp32", "BLEU", "lc-tok BLEU")
    print(table(header, rows))


def wanted_any(wanted: list[str]) -> str:
    """The transduce decoders asked for, as one string (to test for ``int8`` among them)."""
    return ",".join(w for w in wanted if w.startswith("ours"))


def ctranslate2_compute_types() -> set[str]:
    """The compute types CTranslate2's build offers on the CPU (an empty set without CTranslate2)."""
    try:
        import ctranslate2
    except ImportError:
        return set()
    return set(ctranslate2.get_supported_compute_types("cpu"))


def translator_lang(args) -> str:
    """The target language code from the reference file name (``test_2016_flickr.de.gz`` -> ``de``)."""
    name = Path(args.ref).name.removesuffix(".gz")
    return name.rsplit(".", 1)[-1]


if __name__ == "__main__":
    main()
