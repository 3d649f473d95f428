"""Several target languages in one model: target-language tokens (>>fra<<) in the vocabulary, in preparation, in
translation (API, CLI, server), in fine-tuning, and through Hugging Face Marian and CTranslate2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from decodekit import copy_sentences, one_thread
from trainkit import toy_config
from transduce.cli import main
from transduce.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig
from transduce.data import ParallelDataset, prepare
from transduce.errors import DataError
from transduce.model import Transformer
from transduce.search.common import constrain
from transduce.search.translator import Translator
from transduce.text.langs import LanguageError, TargetLanguages, check_code, new_token
from transduce.text.tokenizer import Tokenizer
from transduce.text.vocab import load_vocabulary
from transduce.training.checkpoint import load_model
from transduce.training.train import train

WORDS = ["red", "blue", "green", "cat", "dog", "bird", "runs", "sits"]


def sentences(n: int, seed: int) -> list[str]:
    """``n`` sentences of 2-3 distinct words."""
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(2, 3))) for _ in range(n)]


def reverse(text: str) -> str:
    return " ".join(reversed(text.split()))


def write_toy_corpus(directory: Path, n_train: int = 600, n_valid: int = 20) -> Path:
    """English sources; German: the same words (copy); French: the words reversed. One English side for both."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("valid", n_valid, 1)):
        lines = sentences(n, seed)
        (directory / f"{split}.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (directory / f"{split}.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (directory / f"{split}.fr").write_text("\n".join(map(reverse, lines)) + "\n", encoding="utf-8")
    return directory


# ----------------------------------------------------------------------------------------------------------------------
# codes and tokens


def test_codes_follow_the_pattern_rule():
    assert [check_code(c) for c in ("fr", "fra", "zho_Hans", ">>fra<<")] == ["fr", "fra", "zho_Hans", "fra"]
    for bad in ("French", "f", "FR", "fr-FR", "", "fr fr"):
        with pytest.raises(LanguageError, match="not a language code"):
            check_code(bad)
    assert [new_token(c) for c in ("de", "deu", "fr", "cs", "en", "xx")] == [
        ">>deu<<", ">>deu<<", ">>fra<<", ">>ces<<", ">>eng<<", ">>xx<<"]  # fmt: skip


def test_two_and_three_letter_codes_map_to_the_token_the_vocabulary_holds():
    langs = TargetLanguages({">>deu<<": 5, ">>fr<<": 6, ">>ces<<": 7})
    assert [langs.token_id(c) for c in ("de", "deu", "fr", "fra", ">>fra<<", "cs", "ces")] == [5, 5, 6, 6, 6, 7, 7]
    assert langs.token_ids(["de", "fra", "cs"], 3) == [5, 6, 7]
    assert langs.token_ids("fr", 2) == [6, 6]
    with pytest.raises(
        LanguageError, match=r"^tgt_lang: 'it' is not a target language of this model \(it knows: deu, fr, ces\)$"
    ):
        langs.token_id("it")
    with pytest.raises(LanguageError, match=r"^tgt_lang: missing: this model writes 3 target languages"):
        langs.token_id(None)
    with pytest.raises(LanguageError, match=r"^tgt_lang\[1\]: 'French' is not a language code"):
        langs.token_ids(["de", "French"], 2)
    with pytest.raises(LanguageError, match="2 languages for 3 texts"):
        langs.token_ids(["de", "fr"], 3)
    assert TargetLanguages(langs.tokens, "fra").token_id(None) == 6  # the default
    assert TargetLanguages({}).token_id(None) is None
    wide = TargetLanguages({f">>l{i:02d}<<": i for i in range(300)})  # as OPUS-MT's widest models: a short message
    with pytest.raises(LanguageError, match=r"it knows: l00, l01, .*, l19, and 280 more\)$"):
        wide.token_id("fr")
    with pytest.raises(LanguageError, match="this model has no target-language tokens"):
        TargetLanguages({}).token_id("de")


def test_a_script_or_region_matches_in_any_letter_case():
    langs = TargetLanguages({">>pt_br<<": 5, ">>zho_Hant<<": 6, ">>deu<<": 7})  # as OPUS-MT's vocabularies spell them
    assert [langs.token_id(c) for c in ("pt_BR", "pt_br", "por_BR", "zho_hant", "zh_Hant", "de")] == [5, 5, 5, 6, 6, 7]
    assert langs.find("pt_PT") is None


def test_a_language_that_is_neither_a_code_nor_a_list_is_refused_in_one_line():
    with pytest.raises(LanguageError, match=r"^tgt_lang: expected a language code or a list of them, got int$"):
        TargetLanguages({">>deu<<": 5}).token_ids(5, 2)


def test_tokens_in_the_config_name_their_bare_codes():
    assert DataConfig(tgt_langs=[">>deu<<", "fr"]).tgt_langs == ["deu", "fr"]
    assert DecodeConfig(tgt_lang=">>fra<<").tgt_lang == "fra"
    with pytest.raises(ConfigError, match=r"^tgt_langs\[1\]: 'fra' names the same language as 'fr'$"):
        DataConfig(tgt_langs=["fr", ">>fra<<"])


@pytest.fixture(scope="module")
def tokenizer_with_tokens(tmp_path_factory) -> tuple[Tokenizer, Tokenizer]:
    root = tmp_path_factory.mktemp("tok")
    text = sentences(300, 0) + [s.upper() for s in sentences(50, 1)]
    old = Tokenizer.train(root / "plain", text, vocab_size=300)
    old.with_lang_tokens(root / "langs", [">>deu<<", ">>fra<<", ">>ces<<"])
    return old, Tokenizer.load(root / "langs")


def test_a_token_is_one_piece_after_every_old_one(tokenizer_with_tokens, tmp_path: Path):
    old, tok = tokenizer_with_tokens
    n = old.src_vocab_size
    assert tok.lang_tokens() == {">>deu<<": n, ">>fra<<": n + 1, ">>ces<<": n + 2}
    assert tok.lang_token_tgt_ids() == [n, n + 1, n + 2]  # a joint vocabulary: also target ids (never generated)
    for text in ("red cat runs", "blue >>fra<< bird", ">>ces<<>>deu<<"):  # never split, wherever it stands
        pieces = tok.src_pieces(tok.encode_src(text))
        assert ">" not in "".join(p for p in pieces if p not in tok.lang_tokens())
    assert tok.encode_src("red cat runs") == old.encode_src("red cat runs")  # old pieces keep their ids
    assert old.pieces_in_id_order("src") == tok.pieces_in_id_order("src")[:n]
    again = tok.with_lang_tokens(tmp_path / "again", [">>fra<<"])  # a token the vocabulary holds: nothing new
    assert load_vocabulary(again).src_vocab_size == tok.src_vocab_size


def test_the_search_never_generates_a_suppressed_id():
    config = ModelConfig.preset("test", src_vocab_size=10, tgt_vocab_size=10, suppress_ids=[7, 8])
    log_probs = torch.zeros(2, 10)
    constrain(log_probs, 0, config=config, max_len=torch.tensor([5, 5]), min_len=0, history=torch.zeros(2, 0),
              no_repeat_ngram=0)  # fmt: skip
    assert torch.isneginf(log_probs[:, [0, 1, 7, 8]]).all() and torch.isfinite(log_probs[:, [2, 3, 9]]).all()
    with pytest.raises(ConfigError, match="suppress_ids"):
        ModelConfig.preset("test", src_vocab_size=10, tgt_vocab_size=10, suppress_ids=[2])  # eos


@pytest.mark.parametrize("search", [dict(beam=1), dict(beam=4), dict(sampling=True, nbest=3, seed=1)])
def test_a_model_that_ranks_its_language_token_first_still_never_writes_it(search):
    from transduce.search import generate

    cfg = ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40, output_bias=True, dropout=0.0)
    torch.manual_seed(0)
    free = Transformer(cfg).eval()
    with torch.no_grad():
        free.output.bias[[30, 31]] = 20.0  # the two "language tokens" dominate every step
    suppressed = Transformer(cfg.replace(suppress_ids=[30, 31])).eval()
    suppressed.load_state_dict(free.state_dict())
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    decode = DecodeConfig(max_len_a=0.0, max_len_b=6, **search)
    with one_thread():
        assert any(t in (30, 31) for hyps in generate(free, src, decode) for h in hyps for t in h.tokens)
        outputs = [h.tokens for hyps in generate(suppressed, src, decode) for h in hyps]
    assert outputs and not any(t in (30, 31) for tokens in outputs for t in tokens)


def test_config_checks_the_languages():
    with pytest.raises(ConfigError, match="'fra' names the same language as 'fr'"):
        DataConfig(tgt_langs=["fr", "fra"])
    with pytest.raises(ConfigError, match="tgt_langs\\[1\\]: 'French' is not a language code"):
        DataConfig(tgt_langs=["de", "French"])
    with pytest.raises(ConfigError, match="tgt_lang: 'fr-FR' is not a language code"):
        DecodeConfig(tgt_lang="fr-FR")


# ----------------------------------------------------------------------------------------------------------------------
# preparation


def data_config(train, **changes) -> DataConfig:
    return DataConfig(**{"train": train, "tgt_langs": ["de", "fr"], "vocab_size": 300, "workers": 1, **changes})


def test_a_prefix_reads_each_target_language_and_gives_each_source_its_token(tmp_path: Path):
    corpus = write_toy_corpus(tmp_path / "corpus", n_train=50, n_valid=5)
    prepare(data_config(str(corpus / "train"), valid=str(corpus / "valid")), tmp_path / "prep")
    tok = load_vocabulary(tmp_path / "prep")
    de, fr = tok.lang_tokens()[">>deu<<"], tok.lang_tokens()[">>fra<<"]
    src = (corpus / "train.en").read_text().splitlines()
    data = ParallelDataset(tmp_path / "prep", "train")
    assert len(data) == 100
    for i, (lang, tgt) in enumerate([(de, s) for s in src] + [(fr, reverse(s)) for s in src]):
        ids, tgt_ids = (a.tolist() for a in data[i])
        assert ids == [lang, *tok.encode_src(src[i % 50])] and tok.decode_tgt(tgt_ids) == tgt
    from transduce.training.validate import read_references

    refs, kind = read_references(ParallelDataset(tmp_path / "prep", "valid"), tok)
    valid = (corpus / "valid.en").read_text().splitlines()
    assert kind == "raw" and refs == valid + [reverse(s) for s in valid]


def test_bpe_dropout_keeps_each_source_s_language_token_in_front(tmp_path: Path):
    """The token is a piece put before the text by id: BPE-dropout re-segments the text only. Without dropout it
    gives the prepared pairs back exactly; with it every source still starts with its own token, once."""
    from transduce.data.bpe_dropout import BPEDropoutEpochs

    corpus = write_toy_corpus(tmp_path / "corpus", n_train=50, n_valid=5)
    prepare(data_config(str(corpus / "train"), vocab_type="bpe"), tmp_path / "prep")
    tok = load_vocabulary(tmp_path / "prep")
    data = ParallelDataset(tmp_path / "prep", "train")
    langs = list(tok.lang_tokens().values())
    epochs = BPEDropoutEpochs(data, tok, 0.3, 256, seed=1)
    plain = epochs.src_bpe.encode(epochs.src_text, 0.0, np.random.default_rng(0))
    assert [pre + ids for pre, ids in zip(epochs.src_prefix, plain, strict=True)] == [
        data[i][0].tolist() for i in range(len(data))
    ]
    src, _ = epochs.segment(1)
    assert [s[0] for s in src] == [data[i][0][0] for i in range(len(data))] == [langs[0]] * 50 + [langs[1]] * 50
    assert not any(i in langs for s in src for i in s[1:])
    assert [tok.decode_src(s[1:]) for s in src] == [tok.decode_src(data[i][0][1:]) for i in range(len(data))]


def test_tsv_and_json_lines_name_the_language_of_each_line(tmp_path: Path):
    rows = [
        (s, s, "de") if i % 3 == 0 else (s, reverse(s), ("fra", "fr")[i % 2]) for i, s in enumerate(sentences(300, 2))
    ]
    rows[:3] = [("red cat", "red cat", "de"), ("red cat", "cat red", "fra"), ("blue dog", "dog blue", "fr")]
    (tmp_path / "train.tsv").write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    lines = [json.dumps({"src": s, "tgt": t, "lang": lang}) for s, t, lang in rows]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name, extra in (("train.tsv", {}), ("train.jsonl", {"lang_field": "lang"})):
        prepare(data_config(str(tmp_path / name), **extra), tmp_path / name.replace(".", "_"))
        tok = load_vocabulary(tmp_path / name.replace(".", "_"))
        data = ParallelDataset(tmp_path / name.replace(".", "_"), "train")
        firsts = [int(data[i][0][0]) for i in range(3)]
        assert tok.src_pieces(firsts) == [">>deu<<", ">>fra<<", ">>fra<<"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("train.tsv", "red cat\tred cat\tde\nred cat\tcat red\n", r"train.tsv, line 2: expected "
         r"source<TAB>target<TAB>language \(two tabs: data.tgt_langs is set\), found 1 tab$"),
        ("train.tsv", "red cat\tred cat\tde\nred\tred\tit\n", r"train.tsv, line 2: target language 'it' is not one "
         r"of data.tgt_langs \(de, fr\)$"),
        ("train.tsv", "red cat\tred cat\tFrench\n", r"train.tsv, line 1: 'French' is not a language code"),
        ("train.tsv", "red cat\tred cat\tde\nred\tred\t\n", r"train.tsv, line 2: no target language"),
        ("train.jsonl", '{"src": "a", "tgt": "a", "tgt_lang": "de"}\n{"src": "a", "tgt": "a"}\n',
         r"train.jsonl, line 2: no field 'tgt_lang' for the target language"),
        ("train.jsonl", '{"src": "a", "tgt": "a", "tgt_lang": 3}\n', r"train.jsonl, line 1: field 'tgt_lang' must be "
         "a string, got a number"),
    ],
)  # fmt: skip
def test_a_missing_unknown_or_malformed_language_names_the_line_and_writes_nothing(tmp_path, name, content, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as info:
        prepare(data_config(str(tmp_path / name)), tmp_path / "prep")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "prep").exists() and [p.name for p in tmp_path.iterdir()] == [name]


def test_a_bad_byte_in_a_json_lines_language_names_the_line(tmp_path: Path):
    (tmp_path / "train.jsonl").write_bytes(b'{"src": "a", "tgt": "a", "tgt_lang": "de"}\n'
                                           b'{"src": "a", "tgt": "a", "tgt_lang": "f\xffr"}\n')  # fmt: skip
    for skip in (False, True):
        with pytest.raises(DataError, match=r"train.jsonl, line 2: .*(not a language code|UTF-8)") as info:
            prepare(data_config(str(tmp_path / "train.jsonl"), skip_invalid_utf8=skip), tmp_path / "prep")
        assert "\n" not in str(info.value) and not (tmp_path / "prep").exists()


def test_a_prefix_finds_a_language_under_either_form_of_its_code(tmp_path: Path):
    corpus = write_toy_corpus(tmp_path / "corpus", n_train=30, n_valid=5)
    prepare(data_config(str(corpus / "train"), tgt_langs=["deu", "fra"]), tmp_path / "prep")  # train.de, train.fr
    assert len(ParallelDataset(tmp_path / "prep", "train")) == 60
    (corpus / "train.fra").write_text((corpus / "train.fr").read_text())
    with pytest.raises(DataError, match=r"train.fra and .*train.fr both hold the target side for 'fra': keep one$"):
        prepare(data_config(str(corpus / "train"), tgt_langs=["deu", "fra"]), tmp_path / "prep2")
    with pytest.raises(DataError, match=r"train.it or .*train.ita: file not found \(nor with .gz\)"):
        prepare(data_config(str(corpus / "train"), tgt_langs=["de", "it"]), tmp_path / "prep3")


def test_the_length_ratio_filter_compares_the_texts_without_the_token(tmp_path: Path):
    corpus = write_toy_corpus(tmp_path / "corpus", n_train=30, n_valid=5)  # every target as long as its source
    prepare(data_config(str(corpus / "train"), max_len_ratio=1.0), tmp_path / "prep")
    assert len(ParallelDataset(tmp_path / "prep", "train")) == 60


def test_two_files_take_the_target_files_language(tmp_path: Path):
    corpus = write_toy_corpus(tmp_path / "corpus", n_train=30, n_valid=5)
    prepare(data_config([str(corpus / "train.en"), str(corpus / "train.fr")]), tmp_path / "prep")
    tok = load_vocabulary(tmp_path / "prep")
    assert tok.src_pieces([int(ParallelDataset(tmp_path / "prep", "train")[0][0][0])]) == [">>fra<<"]
    (corpus / "train.txt").write_text((corpus / "train.fr").read_text())
    with pytest.raises(DataError, match=r"train.txt: the target file's suffix 'txt' names no language of "
                                        r"data.tgt_langs \(de, fr\)"):  # fmt: skip
        prepare(data_config([str(corpus / "train.en"), str(corpus / "train.txt")]), tmp_path / "prep2")
    assert not (tmp_path / "prep2").exists()


# ----------------------------------------------------------------------------------------------------------------------
# a toy model with two target languages: copy (de) and reverse (fr)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multilingual")
    corpus = write_toy_corpus(root / "corpus")
    config = toy_config(corpus, root / "run", max_steps=400, valid_every=0, peak_lr=3e-3, warmup_steps=20,
                        max_tokens=512, log_every=100, label_smoothing=0.0)  # fmt: skip
    config = config.replace(data=config.data.replace(tgt_langs=["de", "fr"], vocab_size=300),
                            model=config.model.replace(dropout=0.0, d_model=64, d_ff=128, norm="pre"))  # fmt: skip
    with one_thread():
        train(config)
    return root / "run"


@pytest.mark.slow
def test_the_toy_model_follows_the_target_language_exactly(toy_run: Path):
    tr = Translator.load(toy_run)
    src = (toy_run.parent / "corpus" / "train.en").read_text().splitlines()[:40]  # each seen with both targets
    with one_thread():
        assert tr.translate(src, tgt_lang="de") == src
        assert tr.translate(src, tgt_lang="fra") == [reverse(s) for s in src]
        assert tr.translate(src[:4], tgt_lang=["de", "fr", "deu", "fra"]) == [
            src[0], reverse(src[1]), src[2], reverse(src[3])]  # fmt: skip
        nbest = tr.translate_nbest(src[:10], nbest=4, tgt_lang="fr")
    assert all(">>" not in t.text and "<<" not in t.text for ts in nbest for t in ts)
    tokens = tr.tokenizer.lang_tokens()
    assert sorted(tr.model.config.suppress_ids) == sorted(tokens.values())  # never generated
    with pytest.raises(LanguageError, match="missing"):
        tr.translate(src[:1])
    default = Translator.load(toy_run, decode=tr.decode.replace(tgt_lang="fr"))
    with one_thread():
        assert default.translate(src[:3]) == [reverse(s) for s in src[:3]]


@pytest.mark.slow
def test_cli_translate_takes_tgt_lang_and_refuses_a_missing_or_unknown_one(toy_run: Path, tmp_path: Path, capsys):
    src = (toy_run.parent / "corpus" / "train.en").read_text().splitlines()[:6]
    (tmp_path / "in.en").write_text("\n".join(src) + "\n")
    args = ["translate", "--model", str(toy_run), "-i", str(tmp_path / "in.en"), "--threads", "1"]
    assert main([*args, "--tgt-lang", "fr", "--json", "--nbest", "2", "-o", str(tmp_path / "out.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["translations"][0]["text"] for r in rows] == [reverse(s) for s in src]
    assert ">>" not in (tmp_path / "out.jsonl").read_text()
    capsys.readouterr()
    for option, message in (([], "tgt_lang: missing: this model writes 2 target languages (deu, fra)"),
                            (["--tgt-lang", "it"], "tgt_lang: 'it' is not a target language of this model"),
                            (["--tgt-lang", "Italian"], "--tgt-lang must be a language code")):  # fmt: skip
        try:
            code = main([*args, *option, "-o", str(tmp_path / "no.txt")])
        except SystemExit as e:  # argparse's refusal of a malformed code
            code = e.code
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not (tmp_path / "no.txt").exists()
    # embed reads the sources as the encoder does without a token: no --tgt-lang asked (the API's vectors)
    assert main(["embed", "--model", str(toy_run), "-i", str(tmp_path / "in.en"), "-o", str(tmp_path / "v.npy"),
                 "--threads", "1"]) == 0  # fmt: skip
    import numpy as np

    api = Translator.load(toy_run).embed(src)
    np.testing.assert_array_equal(np.load(tmp_path / "v.pooled.npy"), np.stack([v.pooled for v in api]))
    from transduce.commands.translate import check_target_language

    check_target_language(str(toy_run), None, required=False)  # serve starts: its requests name their language
    check_target_language(str(toy_run), "fr", required=False)
    with pytest.raises(LanguageError, match="it knows: deu, fra"):
        check_target_language(str(toy_run), "it", required=False)  # a default it cannot write is refused


@pytest.mark.slow
def test_the_server_takes_tgt_lang_per_request(toy_run: Path):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from transduce.serving.server import ServerThread, create_app

    src = (toy_run.parent / "corpus" / "train.en").read_text().splitlines()[:3]
    app = create_app(Translator.load(toy_run), batch_wait_ms=1.0)
    with one_thread(), ServerThread(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        r = client.post("/translate", json={"sentences": src, "tgt_lang": "fr"})
        assert r.status_code == 200 and r.json()["translations"] == [reverse(s) for s in src]
        r = client.post("/translate", json={"sentences": src, "tgt_lang": "deu", "nbest": 2})
        assert r.json()["translations"] == src
        for body, message in (({}, "tgt_lang: missing"), ({"tgt_lang": "it"}, "tgt_lang: 'it' is not a target"),
                              ({"tgt_lang": "x y"}, "tgt_lang: 'x y' is not a language code")):  # fmt: skip
            r = client.post("/translate", json={"sentences": src, **body})
            assert r.status_code == 422 and r.json()["error"].startswith(message), r.json()
        r = client.post("/attention", json={"sentence": src[0], "tgt_lang": "fr"})
        assert r.status_code == 200 and r.json()["translation"] == reverse(src[0])
        assert r.json()["src_pieces"][0] == ">>fra<<"


@pytest.mark.slow
def test_a_test_file_that_names_each_lines_language_is_translated_and_scored_per_line(toy_run, tmp_path, capsys):
    src = (toy_run.parent / "corpus" / "train.en").read_text().splitlines()[:6]
    langs = ["de", "fr", "fra", "de", "fr", "deu"]
    refs = [s if lang.startswith("de") else reverse(s) for s, lang in zip(src, langs)]
    (tmp_path / "mixed.tsv").write_text("".join(f"{s}\t{r}\t{lang}\n" for s, r, lang in zip(src, refs, langs)))
    rows = [json.dumps({"src": s, "tgt": r, "tgt_lang": lang}) for s, r, lang in zip(src, refs, langs)]
    (tmp_path / "mixed.jsonl").write_text("\n".join(rows) + "\n")
    model = ["--model", str(toy_run), "--threads", "1"]
    for name in ("mixed.tsv", "mixed.jsonl"):
        out = tmp_path / f"{name}.out"
        assert main(["translate", *model, "-i", str(tmp_path / name), "-o", str(out)]) == 0
        assert out.read_text().splitlines() == refs
        capsys.readouterr()
        assert main(["evaluate", *model, "--src", str(tmp_path / name), "--json", "-q"]) == 0
        assert json.loads(capsys.readouterr().out)["chrf"] == 100.0  # (2-3 words: no 4-grams for BLEU)
    bad = [
        ("it.tsv", f"{src[0]}\t{refs[0]}\tde\n{src[1]}\t{refs[1]}\tit\n", [],
         "it.tsv, line 2: 'it' is not a target language of this model (it knows: deu, fra)"),
        ("two.tsv", f"{src[0]}\t{refs[0]}\tde\n{src[1]}\t{refs[1]}\n", [],
         "two.tsv, line 2: no target language (a third column) where line 1 names one: name every line's target "
         "language or none"),
        ("mixed.tsv", None, ["--tgt-lang", "fr"], "mixed.tsv, line 1: the line's target language 'de' is not "
         "--tgt-lang 'fr'; leave --tgt-lang out to translate each line into the language it names"),
    ]  # fmt: skip
    for name, content, extra, message in bad:
        if content is not None:
            (tmp_path / name).write_text(content)
        for command in (["translate", *model, "-i"], ["evaluate", *model, "--src"]):
            out = tmp_path / "none.txt"
            assert main([*command, str(tmp_path / name), *extra, "-o", str(out)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].endswith(message), err
            assert not out.exists()
    (tmp_path / "hyp.txt").write_text("\n".join(refs) + "\n")
    assert main(["evaluate", "--hyp", str(tmp_path / "hyp.txt"), "--ref", str(tmp_path / "hyp.txt"), "--tgt-lang",
                 "fr"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip().endswith("--tgt-lang applies to translating --src; with --hyp nothing is "
                                                    "translated")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# fine-tuning a model of one target language into several


def test_fine_tuning_adds_the_tokens_initialised_as_extension_initialises_pieces(copy_checkpoint: Path, tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", n_train=60, n_valid=5)
    config = Config(
        model=ModelConfig(dropout=0.0),
        data=DataConfig(train=str(corpus / "train"), tgt_langs=["de", "cs"], workers=1),
        train=toy_config(corpus, tmp_path / "run").train.replace(
            init_from=str(copy_checkpoint), extend_vocab=40, max_steps=0, valid_bleu=False),
    )  # fmt: skip
    (corpus / "train.cs").write_text((corpus / "train.fr").read_text())
    train(config)
    old, _, old_vocab_dir = load_model(copy_checkpoint)
    new, new_config, vocab_dir = load_model(tmp_path / "run")
    old_vocab, vocab = load_vocabulary(old_vocab_dir), load_vocabulary(vocab_dir)
    n = old.config.src_vocab_size
    tokens = vocab.lang_tokens()
    assert list(tokens) == [">>deu<<", ">>ces<<"] and min(tokens.values()) >= n
    assert new_config.model.suppress_ids == list(tokens.values())
    assert torch.equal(new.src_embed.weight[:n], old.src_embed.weight)  # old rows bit for bit
    for token, row in tokens.items():  # the mean of the rows of the token's old segmentation
        ids = old_vocab.encode_src(token)
        if old_vocab.src_pieces(ids[:1]) == ["▁"]:
            ids = ids[1:]
        torch.testing.assert_close(new.src_embed.weight[row], old.src_embed.weight[ids].mean(0), rtol=0, atol=1e-7)
    data = ParallelDataset(tmp_path / "run" / "data", "train")
    assert [int(data[0][0][0]), int(data[60][0][0])] == [tokens[">>deu<<"], tokens[">>ces<<"]]
    tr = Translator.load(tmp_path / "run")
    with one_thread():
        assert len(tr.translate(["red cat"], tgt_lang="cs")) == 1
    with pytest.raises(LanguageError, match="it knows: deu, ces"):
        tr.translate(["red cat"], tgt_lang="fr")


def test_fine_tuning_a_multilingual_model_without_its_languages_is_refused(toy_run: Path, tmp_path: Path):
    from transduce.training.finetune import FinetuneError

    corpus = write_toy_corpus(tmp_path / "corpus", n_train=30, n_valid=5)
    config = Config(
        model=ModelConfig(dropout=0.0), data=DataConfig(train=str(corpus / "train"), workers=1),
        train=toy_config(corpus, tmp_path / "run").train.replace(init_from=str(toy_run), max_steps=0, valid_bleu=False),
    )  # fmt: skip
    with pytest.raises(FinetuneError, match=r"writes 2 target languages \(deu, fra\) and is told which by a token: "
                                            r"set data.tgt_langs"):  # fmt: skip
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


# ----------------------------------------------------------------------------------------------------------------------
# Hugging Face Marian and CTranslate2

LANGS = ["de", "fr", "cs"]


def rotate(text: str) -> str:
    words = text.split()
    return " ".join(words[1:] + words[:1])


@pytest.fixture(scope="module")
def multilingual_checkpoint(tmp_path_factory) -> Path:
    """A post-norm model trained briefly on three target languages (German: copy, French: reverse, Czech: the first
    word moved to the end), so that its translations end by themselves and differ by language."""
    root = tmp_path_factory.mktemp("ml3")
    corpus = write_toy_corpus(root / "corpus", n_train=300)
    for split in ("train", "valid"):
        lines = (corpus / f"{split}.en").read_text().splitlines()
        (corpus / f"{split}.cs").write_text("\n".join(map(rotate, lines)) + "\n", encoding="utf-8")
    config = toy_config(corpus, root / "run", max_steps=150, valid_every=0, peak_lr=3e-3, warmup_steps=20,
                        max_tokens=512, log_every=100, valid_bleu=False)  # fmt: skip
    config = config.replace(data=config.data.replace(tgt_langs=LANGS, vocab_size=300),
                            model=config.model.replace(dropout=0.0))  # fmt: skip
    with one_thread():
        train(config)
    return root / "run"


@pytest.fixture(scope="module")
def multilingual_hf(multilingual_checkpoint: Path, tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from transduce.interop.marian import export_hf

    return export_hf(multilingual_checkpoint, tmp_path_factory.mktemp("ml_hf") / "hf")


def test_hf_export_of_a_multilingual_model_gives_our_logits(multilingual_checkpoint: Path, multilingual_hf: Path):
    transformers = pytest.importorskip("transformers")
    ours = Translator.load(multilingual_checkpoint)
    tok = transformers.MarianTokenizer.from_pretrained(str(multilingual_hf))
    hf = transformers.MarianMTModel.from_pretrained(str(multilingual_hf)).eval()
    text = sentences(9, seed=5)
    tagged = [f"{new_token(LANGS[i % 3])} {s}" for i, s in enumerate(text)]
    batch = tok(tagged, return_tensors="pt", padding=True)
    expected = [[ours.language_ids(LANGS[i % 3], 1)[0], *ours.tokenizer.encode_src(s), 2] for i, s in enumerate(text)]
    assert [ids[: len(e)] for ids, e in zip(batch["input_ids"].tolist(), expected)] == expected  # the token: one id
    tgt_in = torch.tensor([[1, 5, 9, 12]] * len(text))
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in)
        mine = ours.model(batch["input_ids"], tgt_in)
    assert (mine - theirs.logits).abs().max() < 1e-4
    gen = json.loads((multilingual_hf / "generation_config.json").read_text())
    assert sorted(ids for [ids] in gen["bad_words_ids"])[-3:] == sorted(ours.tokenizer.lang_tokens().values())
    assert ">>fra<<" in (multilingual_hf / "README.md").read_text()


@pytest.mark.parametrize("beam", [1, 4])
def test_hf_generate_gives_our_translations_in_each_language(multilingual_checkpoint, multilingual_hf, beam):
    transformers = pytest.importorskip("transformers")
    ours = Translator.load(multilingual_checkpoint)
    tok = transformers.MarianTokenizer.from_pretrained(str(multilingual_hf))
    hf = transformers.MarianMTModel.from_pretrained(str(multilingual_hf)).eval()
    text = sentences(12, seed=7)
    results = {}
    for lang in LANGS:
        batch = tok([f"{new_token(lang)} {s}" for s in text], return_tensors="pt", padding=True)
        with torch.inference_mode():
            # a limit the translations stay under: at the limit Hugging Face scores the forced EOS 0, we its log-prob
            out = hf.generate(**batch, num_beams=beam, length_penalty=0.0, max_new_tokens=16, do_sample=False)
        with one_thread():
            mine = ours.translate(text, tgt_lang=lang, beam=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=15)
        assert tok.batch_decode(out, skip_special_tokens=True) == mine
        results[lang] = mine
    assert len({tuple(r) for r in results.values()}) == 3  # the token changes the translation


def test_ctranslate2_takes_the_token_in_the_source(multilingual_checkpoint: Path, tmp_path: Path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transduce.interop.ctranslate2 import export_ctranslate2
    from transduce.search import generate
    from transduce.search.common import pad_sequences

    out = export_ctranslate2(multilingual_checkpoint, tmp_path / "ct2")
    info = json.loads((out / "transduce.json").read_text())
    assert info["lang_tokens"] == [">>deu<<", ">>fra<<", ">>ces<<"]
    ours = Translator.load(multilingual_checkpoint)
    tok = ours.tokenizer
    text = sentences(10, seed=3)
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    vocab = {p: i for i, p in enumerate(tok.tgt_pieces(range(tok.tgt_vocab_size)))}
    cfg = ours.decode.replace(beam=4, length_penalty=0.0, max_len_a=0.0, max_len_b=8)
    for lang in ("deu", "fra", "ces"):
        pieces = [[f">>{lang}<<", *tok.src_pieces(tok.encode_src(s))] for s in text]
        results = ct.translate_batch(pieces, beam_size=4, length_penalty=0.0, max_decoding_length=8,
                                     suppress_sequences=[[t] for t in info["lang_tokens"]])  # fmt: skip
        theirs = [[vocab[p] for p in r.hypotheses[0]] for r in results]
        src = pad_sequences([[ours.language_ids(lang, 1)[0], *tok.encode_src(s), 2] for s in text], 0)
        with one_thread():
            mine = [hyps[0].tokens for hyps in generate(ours.model, src, cfg)]
        assert theirs == mine


def make_multilingual_marian_dir(directory: Path, tokens: list[str]) -> Path:
    """A random Marian model (Marian's own id conventions) whose one vocabulary holds ``tokens`` after its pieces,
    as OPUS-MT's multilingual models hold theirs; its generation config bans them, as our search does."""
    transformers = pytest.importorskip("transformers")
    import sentencepiece as spm

    directory.mkdir(parents=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(copy_sentences(300, 0)), model_prefix=str(directory / "s"),
                                   vocab_size=36, model_type="unigram", minloglevel=2)  # fmt: skip
    (directory / "s.model").rename(directory / "source.spm")
    (directory / "target.spm").write_bytes((directory / "source.spm").read_bytes())
    proc = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size()) if not proc.is_control(i)]
    pieces = [p for p in pieces if p not in ("<unk>", "</s>", "<s>")]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate([*pieces, *tokens])}}
    vocab["<pad>"] = size = len(vocab)
    size += 1
    (directory / "vocab.json").write_text(json.dumps(vocab))
    config = transformers.MarianConfig(
        vocab_size=size, decoder_vocab_size=size, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        activation_function="swish", max_position_embeddings=128, scale_embedding=True, pad_token_id=size - 1,
        decoder_start_token_id=size - 1, eos_token_id=0, forced_eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(1)
    hf = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.25)
        hf.final_logits_bias.normal_(0.0, 1.0)
    hf.generation_config.bad_words_ids = [[size - 1]] + [[vocab[t]] for t in tokens]
    hf.save_pretrained(str(directory))
    transformers.MarianTokenizer(source_spm=str(directory / "source.spm"), target_spm=str(directory / "target.spm"),
                                 vocab=str(directory / "vocab.json")).save_pretrained(str(directory))  # fmt: skip
    return directory


@pytest.mark.parametrize("beam", [1, 4])
def test_an_imported_multilingual_marian_model_maps_tgt_lang_to_its_tokens(tmp_path: Path, beam: int):
    transformers = pytest.importorskip("transformers")
    from transduce.interop.marian import import_hf, load_hf

    marian = make_multilingual_marian_dir(tmp_path / "marian", [">>deu<<", ">>fra<<", ">>cs<<"])  # a 2-letter one
    model, _, vocab = load_hf(marian)
    assert vocab.lang_tokens() == {
        t: i for t, i in json.loads((marian / "vocab.json").read_text()).items() if ">>" in t
    }
    assert model.config.suppress_ids == list(vocab.lang_tokens().values())
    tok = transformers.MarianTokenizer.from_pretrained(str(marian))
    hf = transformers.MarianMTModel.from_pretrained(str(marian)).eval()
    text = copy_sentences(12, seed=9)
    imported = Translator.load(import_hf(marian, tmp_path / f"ckpt{beam}"))
    for token, codes in ((">>deu<<", ["de", "deu"]), (">>fra<<", ["fr", "fra"]), (">>cs<<", ["cs", "ces"])):
        batch = tok([f"{token} {s}" for s in text], return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = hf.generate(**batch, num_beams=beam, length_penalty=0.0, max_new_tokens=12, do_sample=False)
        expected = tok.batch_decode(out, skip_special_tokens=True)
        options = dict(beam=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=11)
        with one_thread():
            for code in codes:
                assert imported.translate(text, tgt_lang=code, **options) == expected
    with pytest.raises(LanguageError, match="missing"):
        imported.translate(text)


# ----------------------------------------------------------------------------------------------------------------------
# the Multi30k config


@pytest.mark.shared
def test_the_multi30k_config_names_files_that_exist(monkeypatch):
    from transduce.data.preparation import _corpora

    root = Path(__file__).resolve().parents[1]
    if not (root.parent / "shared" / "data" / "multi30k" / "train.cs.gz").is_file():
        pytest.skip("Multi30k not found at ../shared/data/multi30k beside the checkout")
    monkeypatch.chdir(root)
    corpora = _corpora(Config.load(root / "configs" / "multi30k_en_defrcs.yaml").data)
    assert set(corpora) == {"train", "valid", "test_2016_flickr"}
    for parts in corpora.values():
        assert [p.lang for p in parts] == ["de", "fr", "cs"]
        assert len({p.src for p in parts}) == 1  # one English side for the three languages


@pytest.mark.slow
def test_report_refuses_to_score_a_multilingual_run_against_one_language(toy_run: Path):
    from transduce.errors import TransduceError
    from transduce.training.report import evaluate_run

    with pytest.raises(TransduceError, match=r"a model of several target languages \(de, fr\): score each with "):
        evaluate_run(toy_run)
