"""Parsing through the normal path: a treebank prepared with data.task: parse, a tiny model trained in seconds on a
toy grammar, then `transduce parse` (library and command line) and the attention picture of a parse."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from transduce.cli import main
from transduce.config import Config, ConfigError
from transduce.parsing.parser import PAPER_DECODE, Parser
from transduce.parsing.trees import Tree, parse_trees, read_treebank

LEXICON = {
    "DT": ["the", "a"], "NN": ["cat", "dog", "mat", "hat"], "JJ": ["big", "red"], "NNP": ["Kim", "Lee"],
    "VBZ": ["sees", "likes", "sleeps"], "IN": ["on", "with"],
}  # fmt: skip


def _np(rng: random.Random) -> str:
    word = lambda tag: f"({tag} {rng.choice(LEXICON[tag])})"  # noqa: E731
    kind = rng.randrange(3)
    if kind == 0:
        return f"(NP {word('DT')} {word('NN')})"
    if kind == 1:
        return f"(NP {word('DT')} {word('JJ')} {word('NN')})"
    return f"(NP {word('NNP')})"


def toy_tree(rng: random.Random) -> str:
    """S -> NP VP; VP -> VBZ | VBZ NP | VBZ NP PP; PP -> IN NP: the structure follows from the words."""
    verb = f"(VBZ {rng.choice(LEXICON['VBZ'])})"
    kind = rng.randrange(3)
    vp = {0: verb, 1: f"{verb} {_np(rng)}", 2: f"{verb} {_np(rng)} (PP (IN {rng.choice(LEXICON['IN'])}) {_np(rng)})"}
    return f"( (S {_np(rng)} (VP {vp[kind]}) (. .)) )"


def write_toy_treebank(directory: Path) -> tuple[Path, Path]:
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    train, test = directory / "toy_train.mrg", directory / "toy_test.mrg"
    train.write_text("\n".join(toy_tree(rng) for _ in range(1000)) + "\n", encoding="utf-8")
    test.write_text("\n".join(toy_tree(rng) for _ in range(30)) + "\n", encoding="utf-8")
    return train, test


def toy_parse_config(train: Path, test: Path, run_dir: Path, *more: str) -> Config:
    root = Path(__file__).resolve().parents[1]
    overrides = [
        "data.task=parse", "data.src_lang=words", "data.tgt_lang=tree", "data.joint_vocab=false",
        "data.tree_leaves=word",  # the decoder copies the words: a tiny model learns to place the brackets quickly
        f"data.train={train}", f"data.valid={test}", "data.vocab_size=290", f"train.run_dir={run_dir}",
        "model.d_model=64", "model.d_ff=128", "model.dropout=0.1", "train.max_steps=400", "train.max_tokens=1024",
        "train.peak_lr=5.0e-3", "train.warmup_steps=40", "train.schedule=cosine",
        "train.valid_every=0", "train.log_every=50",
        "train.valid_bleu=false", "decode.max_len_b=40", *more,
    ]  # fmt: skip
    return Config.load(root / "configs" / "toy.yaml", overrides=overrides)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from transduce.training.train import train

    directory = tmp_path_factory.mktemp("toy_parse")
    train_mrg, test_mrg = write_toy_treebank(directory / "treebank")
    run_dir = directory / "run"
    outcome = train(toy_parse_config(train_mrg, test_mrg, run_dir))
    assert outcome.exit_code == 0
    return run_dir, test_mrg


@pytest.fixture(scope="module")
def toy_run_in_order(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from transduce.training.train import train

    directory = tmp_path_factory.mktemp("toy_parse_in_order")
    train_mrg, test_mrg = write_toy_treebank(directory / "treebank")
    run_dir = directory / "run"
    overrides = ("data.tree_order=in-order", "train.max_steps=300")
    assert train(toy_parse_config(train_mrg, test_mrg, run_dir, *overrides)).exit_code == 0
    return run_dir, test_mrg


def test_an_ensemble_refuses_members_of_different_tree_orders(toy_run, toy_run_in_order):
    from transduce.search.translator import Translator

    with pytest.raises(ConfigError, match=r"^ensemble: .*run writes its trees in-order, .*run top-down: the members "
                       r"of an ensemble must share one linearisation \(data.tree_order\)$"):  # fmt: skip
        Translator.load([toy_run[0], toy_run_in_order[0]])


def test_prepared_treebank_keeps_its_text_and_a_closed_target_vocabulary(toy_run):
    run_dir, _ = toy_run
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["options"]["task"] == "parse" and manifest["treebanks"]["train"].endswith("toy_train.mrg")
    assert manifest["splits"]["train"]["pairs"] == 1000
    lines = (run_dir / "data" / "text" / "train.tree").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("(S (NP ") and lines[0].endswith(" . )S")
    vocab = json.loads((run_dir / "data" / "tokenizer.json").read_text(encoding="utf-8"))
    # 4 special ids + (S )S (NP )NP (VP )VP (PP )PP + the 15 words of the lexicon and "."
    assert (vocab["joint"], vocab["tgt_vocab_type"], vocab["tgt_vocab_size"]) == (False, "word", 28)


@pytest.mark.parametrize("order", ["top-down", "in-order"])
def test_a_tiny_model_parses_the_toy_grammar_exactly(order, request):
    run_dir, test_mrg = request.getfixturevalue("toy_run" if order == "top-down" else "toy_run_in_order")
    gold = read_treebank(test_mrg)
    parser = Parser.load(run_dir)
    assert parser.decode == PAPER_DECODE and parser.order == order
    first = (run_dir / "data" / "text" / "train.tree").read_text(encoding="utf-8").split(" ", 2)[:2]
    # top-down: "(S (NP the cat )NP ..."; in-order: "the (NP cat )NP (S ..." (a word first, its NP after it)
    assert first[1] == "(NP" and (first[0] == "(S" if order == "top-down" else not first[0].startswith(("(", ")")))
    tokenizer = json.loads((run_dir / "data" / "tokenizer.json").read_text(encoding="utf-8"))
    assert tokenizer.get("tree_order", "top-down") == order
    results = parser.parse([t.words() for t in gold], PAPER_DECODE.replace(beam=4))
    strip = lambda t: t.to_string().replace("(XX ", "(")  # noqa: E731
    for tree, result in zip(gold, results):
        expected = Tree(tree.label, tree.children)
        for node in expected.subtrees():
            if node.is_preterminal():
                node.label = "XX"
        assert strip(result.tree) == strip(expected) and not result.repair.needed


def test_parse_command_scores_a_treebank_and_parses_text(toy_run, tmp_path, capsys):
    run_dir, test_mrg = toy_run
    out, scores = tmp_path / "out.trees", tmp_path / "scores.json"
    args = ["parse", "--model", str(run_dir), "--treebank", str(test_mrg), "--output", str(out), "--beam", "3"]
    assert main([*args, "--scores", str(scores)]) == 0
    assert capsys.readouterr().err.startswith("F1 100.00  P 100.00  R 100.00  exact 100.00%  (30 sentences, 0 ")
    info = json.loads(scores.read_text(encoding="utf-8"))
    assert (info["f1"], info["exact_match"], info["repaired_share"], info["sentences"]) == (100.0, 100.0, 0.0, 30)
    assert info["constrained"] is True
    assert main([*args, "--unconstrained", "--scores", str(scores)]) == 0
    assert json.loads(scores.read_text(encoding="utf-8"))["constrained"] is False
    capsys.readouterr()
    assert len(out.read_text(encoding="utf-8").splitlines()) == 30
    text = tmp_path / "in.txt"
    text.write_text("Kim sees a big dog .\n\nthe cat sleeps .\n", encoding="utf-8")
    assert main(["parse", "--model", str(run_dir), "--input", str(text), "--output", str(out), "--beam", "2"]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == [
        "(S (NP (XX Kim)) (VP (XX sees) (NP (XX a) (XX big) (XX dog))) (XX .))",
        "(TOP)",
        "(S (NP (XX the) (XX cat)) (VP (XX sleeps)) (XX .))",
    ]


def test_attention_picture_of_a_parse(toy_run, tmp_path, capsys):
    run_dir, _ = toy_run
    png = tmp_path / "parse.png"
    assert main(["attention", "--model", str(run_dir), "--src", "Kim sees a dog .", "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    expected = "(S (NP Kim )NP (VP sees (NP a dog )NP )VP . )S </s>"
    assert capsys.readouterr().out.replace("▁", "").strip() == expected  # the target pieces, as drawn
    # the parse drawn is the constrained one of `transduce parse`: a word the model never saw is still a leaf
    assert main(["attention", "--model", str(run_dir), "--src", "Zed sees a dog .", "--out", str(png)]) == 0
    drawn = capsys.readouterr().out.replace("▁", "").split()
    parsed = Parser.load(run_dir).parse([["Zed", "sees", "a", "dog", "."]])[0].output.split()
    assert drawn == [*parsed, "</s>"] and drawn[drawn.index("sees") - 1].startswith("(")


@pytest.fixture(scope="module")
def bracket_translation_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random translation model (data.task: translate) whose target vocabulary has pieces that start with "(":
    its training text had parentheses."""
    import torch

    from transduce.config import DecodeConfig, ModelConfig
    from transduce.model import Transformer
    from transduce.text.tokenizer import Tokenizer
    from transduce.training.checkpoint import save_model

    directory = tmp_path_factory.mktemp("bracket_translation")
    rng = random.Random(0)
    words = ["a", "man", "dog", "(see", "below)", "(NP", "the", "bike", "ein", "Hund", "(S", "das", "Rad"]
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) + "." for _ in range(300)]
    tok = Tokenizer.train(directory / "vocab", text, vocab_size=300)
    assert any(p.lstrip("▁").startswith("(") for p in tok.tgt_pieces(range(tok.tgt_vocab_size)))
    torch.manual_seed(0)
    model_cfg = ModelConfig.preset("test", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size)
    config = Config(model=model_cfg, decode=DecodeConfig(max_len_b=5))
    return save_model(directory / "model", Transformer(model_cfg).eval(), config, directory / "vocab")


def test_attention_draws_a_translation_models_own_translation_whatever_its_pieces(
    bracket_translation_model, tmp_path, capsys
):
    from transduce.search.translator import Translator

    png = tmp_path / "a.png"
    argv = ["attention", "--model", str(bracket_translation_model), "--src", "a man (see below).", "-o", str(png)]
    assert main([*argv, "--device", "cpu"]) == 0
    translator = Translator.load(bracket_translation_model)
    assert translator.task == "translate"
    expected = translator.attention("a man (see below).").tgt_out_pieces
    assert capsys.readouterr().out == " ".join(expected) + "\n"


def test_parse_refuses_a_translation_model_in_one_line(bracket_translation_model, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("a man .\n", encoding="utf-8")
    out = tmp_path / "out.trees"
    argv = ["parse", "--model", str(bracket_translation_model), "--input", str(text), "--output", str(out)]
    assert main([*argv, "--device", "cpu"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith("transduce parse: ") and err.endswith(
        "the model was trained with data.task: translate: parsing needs a model trained with data.task: parse"
    )
    assert not out.exists()


def test_the_task_of_a_parsing_run_travels_with_the_translator(toy_run, bracket_translation_model):
    from transduce.search.translator import Translator

    assert Translator.load(toy_run[0]).task == "parse"
    with pytest.raises(ConfigError, match=r"^ensemble: .* was trained with data.task: translate, .* with "
                       r"data.task: parse: the members of an ensemble must share one task$"):  # fmt: skip
        Translator.load([toy_run[0], bracket_translation_model])


def test_baselines_from_the_command_line(tmp_path, capsys):
    train_mrg, test_mrg = write_toy_treebank(tmp_path / "treebank")
    for baseline in ("pcfg", "right-branching"):
        argv = ["parse", "--baseline", baseline, "--train", str(train_mrg), "--treebank", str(test_mrg),
                "--output", str(tmp_path / f"{baseline}.trees")]  # fmt: skip
        assert main([*argv, "--unlabelled"]) == 0
    pcfg_line, pcfg_unlabelled, rb_line, rb_unlabelled = capsys.readouterr().err.splitlines()
    assert pcfg_line.startswith("F1 100.00")  # the toy grammar is a PCFG: Viterbi finds every tree
    assert pcfg_unlabelled.startswith("unlabelled: F1 100.00")
    assert float(rb_line.split()[1]) < float(rb_unlabelled.split()[2]) < 100.0
    assert main(["parse", "--baseline", "pcfg", "--treebank", str(test_mrg)]) == 2
    assert "--baseline pcfg needs --train SPEC" in capsys.readouterr().err


def test_right_branching_needs_no_training_treebank(tmp_path, capsys):
    text, out = tmp_path / "in.txt", tmp_path / "out.trees"
    text.write_text("Kim sees a dog .\nHi\n", encoding="utf-8")
    assert main(["parse", "--baseline", "right-branching", "-i", str(text), "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == (
        "(S (XX Kim) (VP (XX sees) (VP (XX a) (VP (XX dog) (XX .)))))\n(S (XX Hi))\n"
    )  # the brackets labelled S and VP without a training treebank to take the most frequent labels from
    assert capsys.readouterr().out == ""
    assert main(["parse", "--baseline", "pcfg", "-i", str(text)]) == 2  # a grammar is read from one
    assert (
        capsys.readouterr().err
        == "transduce parse: error: --baseline pcfg needs --train SPEC (the treebank to read it from)\n"
    )


def test_the_scores_go_to_standard_error_and_the_trees_alone_to_standard_output(tmp_path, capsys):
    train_mrg, test_mrg = write_toy_treebank(tmp_path / "treebank")
    argv = ["parse", "--baseline", "right-branching", "--train", str(train_mrg), "--treebank", str(test_mrg)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    gold = read_treebank(test_mrg)
    trees = [next(parse_trees(line)) for line in captured.out.splitlines()]
    assert [t.words() for t in trees] == [t.words() for t in gold]  # nothing but the 30 trees
    assert re.fullmatch(r"F1 \d+\.\d\d  P .*\(30 sentences, .*\)\n", captured.err)
    scores = tmp_path / "scores.json"
    assert main([*argv, "--scores", str(scores), "--output", str(tmp_path / "out.trees")]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("F1 ")
    assert json.loads(scores.read_text(encoding="utf-8"))["sentences"] == 30
    assert main(["parse", "--baseline", "right-branching", "--scores", str(scores), "-i", str(train_mrg)]) == 2
    assert capsys.readouterr().err == (
        "transduce parse: error: --scores needs --treebank SPEC (the trees to score against)\n"
    )


def test_parse_configuration_errors():
    with pytest.raises(ConfigError, match="joint_vocab: parsing has a subword source"):
        Config.from_dict({"data": {"task": "parse"}})
    with pytest.raises(ConfigError, match="task: 'parsing' is not one of 'translate', 'parse'"):
        Config.from_dict({"data": {"task": "parsing"}})


class _NbestTranslator:
    """A stand-in translator whose beam returns fixed hypotheses, best first."""

    def __init__(self, texts: list[str]) -> None:
        from types import SimpleNamespace

        from transduce.search.translator import Translation

        self.hyps = [Translation(t, -float(i), -float(i)) for i, t in enumerate(texts)]
        self.decode = PAPER_DECODE
        pieces = ["<pad>", "<s>", "</s>", "(S", ")S", "XX"]
        self.model = SimpleNamespace(config=SimpleNamespace(tgt_vocab_size=len(pieces), eos_id=2))
        self.tokenizer = SimpleNamespace(tgt_pieces=lambda ids: [pieces[i] for i in ids])
        self.device = "cpu"
        self.task = "parse"
        self.constraints: list = []  # the constraint factory of each call (None: unconstrained)

    def translate_nbest(self, texts, *, nbest, decode, constraint=None):
        assert nbest == decode.beam == 21
        self.constraints.append(constraint)
        return [self.hyps[:nbest] for _ in texts]

    def translate(self, texts, *, decode, constraint=None):
        self.constraints.append(constraint)
        return [self.hyps[0].text for _ in texts]


def test_parse_takes_the_best_well_formed_hypothesis_of_the_beam():
    words = ["Kim", "sleeps", "."]
    beam = ["(S (NP XX )NP XX )S", "(S (NP XX )NP (VP XX )VP XX )S", "(S XX XX XX )S"]
    parser = Parser(_NbestTranslator(beam))  # type: ignore[arg-type]
    (result,) = parser.parse([words])
    assert result.output == beam[1] and not result.repair.needed
    (first,) = parser.parse([words], well_formed=False)
    assert first.output == beam[0] and first.repair.missing_leaves == 1
    assert first.tree.to_string() == "(S (NP (XX Kim)) (XX sleeps) (XX .))"
    (fallback,) = Parser(_NbestTranslator(beam[:1])).parse([words])  # type: ignore[arg-type]
    assert fallback.output == beam[0] and fallback.repair.needed


def test_parse_constrains_the_search_to_the_sentences_words():
    translator = _NbestTranslator(["(S XX XX )S"])
    parser = Parser(translator)  # type: ignore[arg-type]
    parser.parse([["a", "b"], ["c", "d", "e"], ["f"]])
    parser.parse([["a", "b"]], constrained=False)
    rule, none = translator.constraints
    assert none is None
    assert rule([2, 0]).words.tolist() == [1, 2]  # the batch's sentences, by their index in the input


def test_word_leaves_with_a_minimum_count_write_rare_words_as_xx(tmp_path):
    """data.tree_min_count: words seen fewer times in the training trees are XX in every split's target."""
    from transduce.parsing.prepare import treebank_text

    train, test = write_toy_treebank(tmp_path / "treebank")
    train.write_text(train.read_text(encoding="utf-8") + "( (S (NP (NNP Zed)) (VP (VBZ naps)) (. .)) )\n")
    test.write_text("( (S (NP (NNP Zed)) (VP (VBZ yawns)) (. .)) )\n", encoding="utf-8")
    cfg = toy_parse_config(train, test, tmp_path / "run").data.replace(tree_min_count=2)
    out = treebank_text(cfg, tmp_path / "text")
    assert Path(f"{out.train}.tree").read_text(encoding="utf-8").splitlines()[-1] == "(S (NP XX )NP (VP XX )VP . )S"
    assert Path(f"{out.valid}.tree").read_text(encoding="utf-8") == "(S (NP XX )NP (VP XX )VP . )S\n"
    assert Path(f"{out.valid}.words").read_text(encoding="utf-8") == "Zed yawns .\n"
    first = Path(f"{out.train}.tree").read_text(encoding="utf-8").splitlines()[0]
    assert "XX" not in first  # the toy lexicon's words are all frequent
    with pytest.raises(ConfigError, match="tree_min_count"):
        cfg.replace(tree_min_count=0)


def test_swapped_copies_keep_structure_and_tags_and_swap_only_open_class_words():
    """data.tree_swap: a swapped word is a training word of its own tag; determiners, prepositions and punctuation
    stay; share 0 copies the trees, share 1 draws every open-class word anew."""
    from transduce.parsing.prepare import SWAP_TAGS, swap_words
    from transduce.parsing.trees import parse_trees

    rng = random.Random(1)
    trees = list(parse_trees("\n".join(toy_tree(rng).strip()[2:-2] for _ in range(200))))
    lexicon: dict[str, set[str]] = {}
    for tree in trees:
        for word, tag in zip(tree.words(), tree.tags(), strict=True):
            lexicon.setdefault(tag, set()).add(word)
    copies = swap_words(trees, 2, 0.5)
    assert len(copies) == 400
    assert swap_words(trees, 2, 0.5) == copies  # deterministic
    swapped = kept = 0
    for i, copy in enumerate(copies):
        tree = trees[i % len(trees)]  # copy 1 of every tree, then copy 2
        assert copy.tags() == tree.tags()
        assert _shape(copy) == _shape(tree)
        for old, new, tag in zip(tree.words(), copy.words(), tree.tags(), strict=True):
            assert new in lexicon[tag]
            if tag not in SWAP_TAGS:
                assert new == old
            elif new != old:
                swapped += 1
            else:
                kept += 1
    assert 0.3 < swapped / (swapped + kept) < 0.55  # share 0.5, and a draw may give the word back
    assert swap_words(trees, 1, 0.0) == trees
    changed = [
        a != b
        for copy, tree in zip(swap_words(trees, 1, 1.0), trees, strict=True)
        for a, b, tag in zip(copy.words(), tree.words(), tree.tags(), strict=True)
        if tag in SWAP_TAGS
    ]
    assert sum(changed) / len(changed) > 0.6  # every word drawn again (2-4 words a tag: the same one at times)
    assert trees[0].to_string().startswith("(S (NP")  # the originals are not changed


def _shape(tree: Tree) -> str:
    """The bracketing without the words."""
    return " ".join(f"({child.label} {_shape(child)})" if isinstance(child, Tree) else "w" for child in tree.children)


def test_prepare_adds_the_swapped_copies_to_the_training_split_only(tmp_path):
    from transduce.parsing.prepare import treebank_text

    train, test = write_toy_treebank(tmp_path / "treebank")
    cfg = toy_parse_config(train, test, tmp_path / "run").data.replace(tree_swap_copies=2, tree_swap=1.0)
    out = treebank_text(cfg, tmp_path / "text")
    words = Path(f"{out.train}.words").read_text(encoding="utf-8").splitlines()
    trees = Path(f"{out.train}.tree").read_text(encoding="utf-8").splitlines()
    assert len(words) == len(trees) == 3000  # the 1,000 trees, then two swapped copies of each
    original = treebank_text(cfg.replace(tree_swap_copies=0), tmp_path / "plain")
    assert Path(f"{original.train}.words").read_text(encoding="utf-8").splitlines() == words[:1000]
    assert words[1000] != words[0] and len(words[1000].split()) == len(words[0].split())
    for line, tree in zip(words, trees, strict=True):  # each copy's target has its own words as leaves
        assert [t for t in tree.split() if t[0] not in "()"] == line.split()
    valid = Path(f"{out.valid}.words").read_text(encoding="utf-8")
    assert valid == Path(f"{original.valid}.words").read_text(encoding="utf-8")
    with pytest.raises(ConfigError, match=r"tree_swap: must be in \[0, 1\], got 1.5"):
        cfg.replace(tree_swap=1.5)
    with pytest.raises(ConfigError, match="tree_swap_copies"):
        cfg.replace(tree_swap_copies=-1)
