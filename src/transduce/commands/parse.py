"""Parse sentences into constituency trees with a model trained with data.task: parse (or a baseline), and score
the trees against a treebank with EVALB's labelled bracketing (COLLINS.prm).

Examples:
  transduce parse --model runs/ptb_parse < sentences.txt > trees.txt        # one tokenised sentence per line
  transduce parse --model runs/ptb_parse -i sentences.txt -o trees.txt
  transduce parse --model runs/ptb_parse --treebank ptb/wsj.mrg.tar.gz:wsj_0140-wsj_0169 --output dev.trees
  transduce parse --baseline pcfg --train ptb/wsj.mrg.tar.gz:wsj_0001-wsj_0139 --treebank ptb/...:wsj_0140-wsj_0169
  transduce parse --baseline right-branching --treebank ptb/wsj.mrg.tar.gz:wsj_0140-wsj_0169 > dev.trees

Input sentences are tokenised as the treebank is (Penn Treebank tokens separated by spaces). With --treebank the words
of its trees are parsed, and precision, recall, F1, exact match and the share of outputs that needed repair are printed
on standard error (and written to --scores as JSON): standard output carries the trees alone. The right-branching
baseline takes its two labels from --train when given (S and VP otherwise). Every output is a well-formed tree over
exactly the input words; its part-of-speech tags are XX. Decoding defaults to the paper's search for parsing (beam 21,
GNMT length penalty 0.3, maximum length input + 300); --run-decoding takes the run's decode config instead, and options
override either.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from transduce.commands.options import add_output_argument, check_file_output, non_negative_int, positive_int
from transduce.commands.translate import add_model_arguments, check_input, decode_config
from transduce.files import Files, open_output, write_text

log = logging.getLogger(__name__)

BASELINES = ("pcfg", "right-branching")
MAX_WORDS = 400  # the default of --max-words: CKY's time grows with the cube of a sentence's length


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "input", "treebank", "train"), outputs=("output", "scores"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    for action in parser._actions:  # --model is not needed for a baseline
        if action.dest == "model":
            action.required = False
    parser.add_argument(
        "-i", "--input", default="-", metavar="FILE", help="sentences, one per line (default: stdin; .gz is read)"
    )
    parser.add_argument("--treebank", metavar="SPEC", help="parse the words of these trees and score the parses")
    add_output_argument(parser, "trees, one per line (default: stdout)", metavar="FILE", default="-")
    parser.add_argument(
        "--scores", metavar="FILE.json", help="with --treebank: also write the scores as JSON (printed on stderr)"
    )
    parser.add_argument(
        "--first-best", action="store_true",
        help="the beam's best output, repaired if need be (default: its best well-formed output, if it has one)",
    )  # fmt: skip
    parser.add_argument(
        "--unconstrained", action="store_true",
        help="let the search produce any token sequence, mended into a tree afterwards (default: only well-formed "
        "trees with one leaf per word)",
    )  # fmt: skip
    parser.add_argument("--unlabelled", action="store_true", help="with --treebank: also print unlabelled scores")
    parser.add_argument("--run-decoding", action="store_true", help="decode with the run's config, not the paper's")
    parser.add_argument(
        "--max-words", type=positive_int, default=MAX_WORDS, metavar="N",
        help=f"refuse a sentence of more than N words (default: {MAX_WORDS}; the longest Penn Treebank one has 141)",
    )  # fmt: skip
    g = parser.add_argument_group("baselines (instead of --model)")
    g.add_argument("--baseline", choices=BASELINES, help="a treebank PCFG (Viterbi CKY) or right-branching trees")
    g.add_argument(
        "--train", metavar="SPEC",
        help="the training treebank the baseline is read from (right-branching: for its two labels; S and VP without)",
    )  # fmt: skip
    g.add_argument("--markov", type=non_negative_int, default=2, help="PCFG: horizontal Markov order of binarisation")
    g.add_argument("--parent", action="store_true", help="PCFG: parent annotation")


def run(args: argparse.Namespace) -> int:
    import torch

    from transduce.errors import TransduceError
    from transduce.parsing.evalb import evalb
    from transduce.parsing.trees import read_treebank
    from transduce.text.textio import read_lines

    if args.baseline == "pcfg" and not args.train:
        raise TransduceError("--baseline pcfg needs --train SPEC (the treebank to read it from)")
    if not args.baseline and not args.model:
        raise TransduceError("give --model RUN_DIR (a model trained with data.task: parse) or --baseline")
    if args.scores and not args.treebank:
        raise TransduceError("--scores needs --treebank SPEC (the trees to score against)")
    check_file_output(args.output, "-o/--output")
    check_file_output(args.scores, "--scores")
    if args.threads:
        torch.set_num_threads(args.threads)
    gold = read_treebank(args.treebank) if args.treebank else None
    if gold is not None:
        if not gold:
            raise TransduceError(f"{args.treebank}: no trees to parse")
        numbered = [(f"{args.treebank}, tree {i}", tree.words()) for i, tree in enumerate(gold, start=1)]
    else:
        check_input(args.input, what="parse", hint="")
        name = "standard input" if args.input == "-" else args.input
        numbered = [(f"{name}, line {n}", line.split()) for n, line in read_lines(args.input)]
    for where, words in numbered:
        if len(words) > args.max_words:
            raise TransduceError(f"{where}: {len(words):,} words, more than --max-words {args.max_words}")
    sentences = [words for _, words in numbered]
    started = time.perf_counter()
    if args.baseline:
        trees, repaired = _baseline(args, read_treebank(args.train) if args.train else None, sentences), None
    else:
        from transduce.parsing.parser import PAPER_DECODE, Parser
        from transduce.search.translator import Translator

        check_parsing_models(args.model)
        parser = Parser(Translator.load(args.model, args.device, max_input_tokens=args.max_input_tokens))
        base = parser.translator.decode if args.run_decoding else PAPER_DECODE
        results = parser.parse(
            sentences, decode_config(args, base), well_formed=not args.first_best, constrained=not args.unconstrained
        )
        trees, repaired = [r.tree for r in results], [r.repair.needed for r in results]
    seconds = time.perf_counter() - started
    with open_output(args.output) as out:
        for tree in trees:
            out.write(tree.to_string() + "\n")
    log.info("parsed %d sentences in %.1f s", len(trees), seconds)
    if gold is not None:  # the scores on stderr: stdout carries the trees and nothing else
        score = evalb(gold, trees, repaired=repaired)
        print(score.summary(), file=sys.stderr)
        if args.unlabelled:
            from dataclasses import replace

            from transduce.parsing.evalb import COLLINS

            unlabelled = evalb(gold, trees, replace(COLLINS, labelled=False), repaired=repaired)
            print("unlabelled:", unlabelled.summary(), file=sys.stderr)
        if args.scores:
            info = {**score.to_dict(), "treebank": args.treebank, "seconds": round(seconds, 1),
                    "parser": args.baseline or " + ".join(args.model),
                    **({} if args.baseline else {"constrained": not args.unconstrained})}  # fmt: skip
            write_text(args.scores, json.dumps(info, indent=2) + "\n")
    return 0


def check_parsing_models(paths: list[str]) -> None:
    """Refuse a translation model from its recorded task before any weights are loaded.

    Raises:
        ConfigError: naming the model and its task.
    """
    from transduce.config import ConfigError
    from transduce.training import checkpoint as ckpt

    for path in paths:
        try:
            task = ckpt.read_info(path).config.data.task
        except ckpt.CheckpointError:  # not a transduce checkpoint (missing, or a Marian directory): loading says so
            continue
        if task != "parse":
            raise ConfigError(f"{path}: the model was trained with data.task: {task}: parsing needs a model trained "
                              "with data.task: parse")  # fmt: skip


def _baseline(args: argparse.Namespace, train, sentences):
    from transduce.parsing.pcfg import PCFG, right_branching, right_branching_labels

    if args.baseline == "right-branching":  # labelled as the training trees mostly are, else S and VP
        root, label = right_branching_labels(train) if train is not None else ("S", "VP")
        return [right_branching(words, root, label) for words in sentences]
    grammar = PCFG.train(train, markov=args.markov, parent=args.parent)
    trees = []
    for i, words in enumerate(sentences):
        trees.append(grammar.parse(words))
        if (i + 1) % 50 == 0:
            log.info("PCFG: %d of %d sentences parsed", i + 1, len(sentences))
    if grammar.failures:
        log.warning("PCFG: %d sentences had no parse under the grammar (flat trees given)", grammar.failures)
    return trees
