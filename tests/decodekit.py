"""Helpers for the decoding tests: a character-level tokenizer and a tiny model trained in seconds to reverse
strings, so that translation can be checked for exactness without a real corpus."""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterable
from pathlib import Path

import torch

from transduce.config import ModelConfig
from transduce.model import Transformer
from transduce.text.special import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID

ALPHABET = "abcdefgh"


class CharTokenizer:
    """One id per character of ``alphabet`` (after the four special ids); anything else is UNK. Implements the
    tokenizer methods the Translator uses."""

    def __init__(self, alphabet: str = ALPHABET):
        self.alphabet = alphabet
        self.ids = {c: i + 4 for i, c in enumerate(alphabet)}
        self.pieces = [PAD, BOS, EOS, UNK, *alphabet]

    @property
    def src_vocab_size(self) -> int:
        return len(self.pieces)

    tgt_vocab_size = src_vocab_size

    def encode_src(self, text: str) -> list[int]:
        return [self.ids.get(c, UNK_ID) for c in text if not c.isspace()]

    encode_tgt = encode_src

    def decode_tgt(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            if i == EOS_ID:
                break
            if i >= 4:
                out.append(self.pieces[i])
            elif i == UNK_ID:
                out.append("?")
        return "".join(out)

    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    tgt_pieces = src_pieces


def task_batch(
    rng: random.Random, n: int, max_len: int = 8, *, reverse: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` random strings over the alphabet and their reversals (or copies): (src, tgt_in, tgt_out) tensors."""
    srcs = [[rng.randrange(4, 4 + len(ALPHABET)) for _ in range(rng.randint(1, max_len))] for _ in range(n)]
    width = max_len + 1

    def pad(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])

    return (
        pad([[*s, EOS_ID] for s in srcs]),
        pad([[BOS_ID, *(s[::-1] if reverse else s)] for s in srcs]),
        pad([[*(s[::-1] if reverse else s), EOS_ID] for s in srcs]),
    )


def train_task_model(
    steps: int = 400, *, reverse: bool = True, max_len: int = 8, batch: int = 128, lr: float = 5e-3, seed: int = 0
) -> Transformer:
    """A small Transformer (2+2 layers, d_model 64) trained with plain Adam to reverse (or copy) strings of 1-8
    letters. Runs single-threaded: on a busy 2-core machine OpenMP threads spinning against each other are >10x
    slower than one thread."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    vocab = len(ALPHABET) + 4
    cfg = ModelConfig.preset("test", src_vocab_size=vocab, tgt_vocab_size=vocab, dropout=0.0, d_model=64, d_ff=128)
    model = Transformer(cfg)
    fit(model, lambda: task_batch(rng, batch, max_len, reverse=reverse), steps=steps, lr=lr)
    return model


def fit(model: Transformer, next_batch, *, steps: int, lr: float) -> None:
    """Train ``model`` for ``steps`` updates of plain Adam (50 warmup updates; the rate decays linearly to zero over
    the second half, so that the model settles: a constant rate left a few of 300 test words wrong, depending on
    floating-point details of training) and cross-entropy on the
    ``(src, tgt_in, tgt_out)`` batches ``next_batch()`` returns, single-threaded; leaves it in eval mode."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50, 2.0 * (1.0 - s / steps)))
    model.train()
    with one_thread():
        for _ in range(steps):
            src, tgt_in, tgt_out = next_batch()
            logits = model(src, tgt_in)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()


@contextlib.contextmanager
def one_thread():
    """Run torch single-threaded (tiny tensors gain nothing from threads, and lose a lot on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.cache
def reversal_model() -> Transformer:
    """The reversal model, trained once per test process and shared by the test files (do not modify it)."""
    return train_task_model()


def make_checkpoint(
    directory: Path,
    *,
    max_len_b: int = 5,
    seed: int = 0,
    lang_tokens: tuple[str, ...] = (),
    tgt_lang: str = "",
    norm: str = "post",
) -> Path:
    """A standalone checkpoint of a random ``test``-preset model with a real SentencePiece vocabulary (trained here
    on a few words), for ``Translator.load`` and CLI tests. Decoding defaults to short outputs (``max_len_b``).
    ``lang_tokens`` (``(">>deu<<", ">>fra<<")``): a multilingual model's target-language tokens, never generated;
    ``tgt_lang``: its default target language (``decode.tgt_lang``). ``norm``: ``pre`` for a pre-norm model."""
    from transduce.config import Config, DataConfig, DecodeConfig
    from transduce.text.langs import TOKEN
    from transduce.text.tokenizer import Tokenizer
    from transduce.text.vocab import load_vocabulary
    from transduce.training.checkpoint import save_model

    rng = random.Random(seed)
    words = ["a", "man", "dog", "rides", "the", "bike", "ein", "Mann", "Hund", "fährt", "das", "Rad", "café"]
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) + "." for _ in range(300)]
    vocab_dir = directory / "vocab"
    tok = Tokenizer.train(vocab_dir, text, vocab_size=300)
    if lang_tokens:
        vocab_dir = tok.with_lang_tokens(directory / "vocab_langs", lang_tokens)
        tok = load_vocabulary(vocab_dir)
    torch.manual_seed(seed)
    model_cfg = ModelConfig.preset(
        "test", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, norm=norm
    )
    data = DataConfig()
    if lang_tokens:
        model_cfg = model_cfg.replace(suppress_ids=tok.lang_token_tgt_ids())
        data = DataConfig(tgt_langs=[TOKEN.fullmatch(t).group(1) for t in lang_tokens])  # data.tgt_lang stays "de"
    config = Config(model=model_cfg, data=data, decode=DecodeConfig(max_len_b=max_len_b, tgt_lang=tgt_lang))
    return save_model(directory / "model", Transformer(model_cfg).eval(), config, vocab_dir)


COPY_WORDS = ["a", "man", "dog", "rides", "the", "red", "bike", "near", "two", "girls", "play", "on", "grass", "café"]


def copy_sentences(n: int, seed: int) -> list[str]:
    """``n`` random sentences of 1-5 words from :data:`COPY_WORDS`, ending with a full stop."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(COPY_WORDS) for _ in range(rng.randint(1, 5))) + "." for _ in range(n)]


def train_copy_checkpoint(
    directory: Path, *, steps: int = 300, lr: float = 1e-2, norm: str = "post", seed: int = 0
) -> Path:
    """A standalone checkpoint of a small model (2+2 layers, d_model 64) with a real SentencePiece vocabulary,
    trained in a few seconds to copy word sentences (target = source). Unlike :func:`make_checkpoint`'s random
    model, its translations are confident and exact, so other decoders (Hugging Face, CTranslate2, the server)
    must reproduce them token for token. Returns the checkpoint directory ``directory/model``."""
    from transduce.config import Config, DecodeConfig
    from transduce.search.common import pad_sequences
    from transduce.text.tokenizer import Tokenizer
    from transduce.training.checkpoint import save_model

    vocab_dir = directory / "vocab"
    tok = Tokenizer.train(vocab_dir, copy_sentences(400, seed), vocab_size=300)
    torch.manual_seed(seed)
    cfg = ModelConfig.preset(
        "test", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, dropout=0.0, d_model=64,
        d_ff=128, norm=norm,
    )  # fmt: skip
    model = Transformer(cfg)
    rng = random.Random(seed)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = tok.encode_src_batch(copy_sentences(64, seed=rng.randrange(1 << 30)))
        return (
            pad_sequences([[*s, EOS_ID] for s in ids], PAD_ID),
            pad_sequences([[BOS_ID, *s] for s in ids], PAD_ID),
            pad_sequences([[*s, EOS_ID] for s in ids], PAD_ID),
        )

    fit(model, next_batch, steps=steps, lr=lr)
    config = Config(model=cfg, decode=DecodeConfig(beam=4))
    return save_model(directory / "model", model, config, vocab_dir)
