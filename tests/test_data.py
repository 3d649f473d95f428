"""Reading raw text (the splitlines trap, UTF-8 errors, unequal files), token-budget batching and collation."""

from __future__ import annotations

import gzip
import logging
import re

import numpy as np
import pytest
import torch

from transduce.data import Batch, TokenBatchSampler, collate, padding_stats, read_manifest
from transduce.data.output import read_json
from transduce.errors import DataError
from transduce.text.special import BOS_ID, EOS_ID, PAD_ID
from transduce.text.textio import count_lines, read_lines, read_parallel, resolve_corpus_file

# ----------------------------------------------------------------------------------------------------------------------
# reading text

TRAP = "a\u2028b", "c\x85d", "e\x0cf", "g\u2029h\x0bi", "plain"


@pytest.mark.parametrize("gz", [False, True])
def test_lines_split_on_newline_only(tmp_path, gz):
    data = "\n".join(TRAP).encode() + b"\n"
    path = tmp_path / ("t.gz" if gz else "t.txt")
    path.write_bytes(gzip.compress(data) if gz else data)
    assert len(data.decode().splitlines()) > len(TRAP)  # the trap: str.splitlines breaks these lines
    assert list(read_lines(path)) == list(enumerate(TRAP, start=1))
    assert count_lines(path) == len(TRAP)


def test_parallel_files_stay_aligned_across_unicode_line_separators(tmp_path):
    (tmp_path / "c.en").write_text("one\u2028more\ntwo\nthree\n", encoding="utf-8", newline="")
    (tmp_path / "c.de").write_text("eins\nzwei\ndrei\n", encoding="utf-8", newline="")
    pairs = list(read_parallel(tmp_path / "c.en", tmp_path / "c.de"))
    assert pairs == [(1, "one\u2028more", "eins"), (2, "two", "zwei"), (3, "three", "drei")]


def test_crlf_bom_and_missing_final_newline(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\nsecond\r\n\nlast")
    assert list(read_lines(path)) == [(1, "first"), (2, "second"), (3, ""), (4, "last")]
    assert count_lines(path) == 4
    path.write_bytes(b"")
    assert list(read_lines(path)) == [] and count_lines(path) == 0


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.en"
    path.write_bytes(b"fine\nbr\xffoken\nfine again\n")
    with pytest.raises(DataError) as e:
        list(read_lines(path))
    assert str(e.value) == f"{path}, line 2: not valid UTF-8 (byte 0xff at column 3)"
    assert list(read_lines(path, errors="skip")) == [(1, "fine"), (3, "fine again")]


def test_invalid_utf8_replaced_keeps_every_line_with_a_warning(tmp_path, caplog):
    path = tmp_path / "bad.en"
    path.write_bytes(b"fine\nbr\xffoken\nfine again\n")
    with caplog.at_level(logging.WARNING):
        assert list(read_lines(path, errors="replace")) == [(1, "fine"), (2, "br\ufffdoken"), (3, "fine again")]
    assert f"{path}, line 2: not valid UTF-8 (byte 0xff at column 3): replaced the invalid bytes" in caplog.text
    with pytest.raises(DataError, match=r"column 3\); try this$"):
        list(read_lines(path, hint="try this"))
    with pytest.raises(ValueError, match="errors must be one of"):
        list(read_lines(path, errors="ignore"))


def test_unequal_line_counts_name_both_files_and_counts(tmp_path):
    (tmp_path / "c.en").write_text("1\n2\n3\n4\n5\n")
    (tmp_path / "c.de").write_text("1\n2\n3\n")
    with pytest.raises(DataError) as e:
        list(read_parallel(tmp_path / "c.en", tmp_path / "c.de"))
    assert str(e.value) == (
        f"{tmp_path / 'c.en'} has 5 lines but {tmp_path / 'c.de'} has 3: a parallel corpus needs one line per "
        "sentence on both sides"
    )
    with pytest.raises(DataError, match=r"c\.de has 3 lines but .*c\.en has 5"):
        list(read_parallel(tmp_path / "c.de", tmp_path / "c.en"))


def test_json_files_of_a_prepared_directory_name_the_file_and_the_problem(tmp_path):
    missing = tmp_path / "nothing.json"
    with pytest.raises(DataError, match=rf"^{re.escape(str(missing))}: file not found$"):
        read_json(missing)
    manifest = tmp_path / "manifest.json"
    with pytest.raises(DataError, match=r": file not found \(run `transduce prepare` first\)$"):
        read_manifest(tmp_path)
    manifest.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(str(manifest))}: not valid JSON \("):
        read_manifest(tmp_path)
    manifest.write_text('{"splits": {}}', encoding="utf-8")
    assert read_manifest(tmp_path) == read_json(manifest) == {"splits": {}}


def test_corpus_files_plain_or_gzip_and_missing(tmp_path):
    (tmp_path / "a.en.gz").write_bytes(gzip.compress(b"x\n"))
    (tmp_path / "a.de").write_text("y\n")
    assert resolve_corpus_file(tmp_path / "a", "en") == tmp_path / "a.en.gz"
    assert resolve_corpus_file(tmp_path / "a", "de") == tmp_path / "a.de"
    with pytest.raises(DataError) as e:
        resolve_corpus_file(tmp_path / "a", "fr")
    assert str(e.value) == f"{tmp_path / 'a.fr'}: file not found (nor a.fr.gz)"
    with pytest.raises(DataError, match=r"^.*nothing\.txt: file not found$"):
        list(read_lines(tmp_path / "nothing.txt"))


def test_truncated_gzip_is_a_data_error(tmp_path):
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress(b"line\n" * 1000)[:-30])
    with pytest.raises(DataError, match=r"t\.gz: corrupt or truncated gzip file"):
        list(read_lines(path))


# ----------------------------------------------------------------------------------------------------------------------
# batching


def lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, n)
    tgt = np.clip(src + rng.integers(-10, 12, n), 1, None)
    return src, tgt


def cost(indices: list[int], lens: np.ndarray) -> int:
    return len(indices) * (int(lens[indices].max()) + 1)


@pytest.mark.parametrize("max_tokens", [64, 500, 4096])
def test_token_budget_is_never_exceeded(max_tokens):
    src, tgt = lengths(3000)
    sampler = TokenBatchSampler(src, tgt, max_tokens, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == sampler.num_batches
    over_long = set(np.flatnonzero(np.maximum(src, tgt) + 1 > max_tokens).tolist())
    for b in batches:
        if len(b) == 1 and b[0] in over_long:
            continue  # a pair that alone exceeds the budget gets a batch of its own
        assert cost(b, src) <= max_tokens and cost(b, tgt) <= max_tokens
        assert not over_long & set(b)
    assert sorted(i for b in batches for i in b) == list(range(3000))


def test_over_long_pair_gets_its_own_batch_and_a_warning(caplog):
    src, tgt = np.array([3, 100, 4, 5]), np.array([3, 2, 4, 200])
    with caplog.at_level(logging.WARNING):
        sampler = TokenBatchSampler(src, tgt, 50, seed=0)
    assert "2 sentence pairs are longer than max_tokens=50 allows; each gets a batch of its own" in caplog.text
    batches = list(sampler)
    assert [1] in batches and [3] in batches
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]


def test_max_sentences():
    src, tgt = lengths(1000)
    assert all(len(b) <= 7 for b in TokenBatchSampler(src, tgt, 4096, seed=0, max_sentences=7))


def test_batches_are_deterministic_for_a_seed_and_reshuffled_per_epoch():
    src, tgt = lengths(2000)
    a = TokenBatchSampler(src, tgt, 800, seed=5)
    b = TokenBatchSampler(src, tgt, 800, seed=5)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(map(sorted, second)) == sorted(map(sorted, first))
    a.set_epoch(0)
    assert list(a) == first
    assert list(TokenBatchSampler(src, tgt, 800, seed=6)) != first


def test_unshuffled_batches_come_in_length_order():
    src, tgt = lengths(500)
    batches = list(TokenBatchSampler(src, tgt, 600, seed=0, shuffle=False))
    longest = [max(int(src[b].max()), int(tgt[b].max())) for b in batches]
    assert longest == sorted(longest)


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
@pytest.mark.parametrize("n", [7, 1001])
def test_every_pair_exactly_once_per_epoch_across_ranks_with_equal_batch_counts(world_size, n):
    src, tgt = lengths(n)
    for epoch in (0, 1):
        seen, counts = [], set()
        for rank in range(world_size):
            sampler = TokenBatchSampler(src, tgt, 300, seed=1, rank=rank, world_size=world_size)
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert len(batches) == len(sampler)
            assert all(len(b) > 0 for b in batches)  # no empty batch
            counts.add(len(batches))
            seen += [i for b in batches for i in b]
            assert all(cost(b, src) <= 300 and cost(b, tgt) <= 300 for b in batches)
        assert len(counts) == 1
        assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize(
    ("lens", "max_tokens", "max_sentences"),
    [([3, 3, 3], 100, 1), ([30, 30, 30], 10, 0), ([5, 30, 6, 40, 7], 10, 0), ([3] * 7, 100, 1), ([2, 4, 6, 8], 3, 0)],
    ids=["max_sentences=1", "all-oversized", "mixed-oversized", "7-singletons", "4-oversized"],
)
def test_single_sentence_batches_are_merged_never_split_into_empty_ones(world_size, lens, max_tokens, max_sentences):
    src = tgt = np.array(lens)
    seen, counts = [], set()
    for rank in range(world_size):
        sampler = TokenBatchSampler(
            src, tgt, max_tokens, seed=0, rank=rank, world_size=world_size, max_sentences=max_sentences
        )
        for epoch in (0, 1):
            batches = list(sampler.iter_from(epoch))
            assert all(len(b) > 0 for b in batches), batches
            counts.add(len(batches))
            if epoch == 0:
                seen += [i for b in batches for i in b]
    assert len(counts) == 1
    assert sorted(seen) == list(range(len(lens)))


def test_merging_single_sentence_batches_is_logged(caplog):
    with caplog.at_level(logging.WARNING):
        sampler = TokenBatchSampler([3, 3, 3], [3, 3, 3], 100, seed=0, world_size=2, max_sentences=1)
    assert sampler.num_batches == 2
    assert "merged 1 pair(s) of single-sentence batches (over the batch budget) so that 2 ranks" in caplog.text


def test_ranks_at_the_same_step_get_batches_of_similar_shape():
    src, tgt = lengths(5000)
    ranks = [list(TokenBatchSampler(src, tgt, 1000, seed=2, rank=r, world_size=4)) for r in range(4)]
    spreads = []
    for step in zip(*ranks):  # the ranks' batches at one step are neighbours in length order
        longest = [int(np.maximum(src[b], tgt[b]).max()) for b in step]
        assert longest == sorted(longest)
        spreads.append(longest[-1] - longest[0])
    assert np.mean(spreads) <= 2


def test_more_ranks_than_pairs_is_an_error():
    with pytest.raises(DataError, match=r"^3 sentence pairs cannot be shared among 4 ranks$"):
        TokenBatchSampler(np.array([1, 2, 3]), np.array([1, 2, 3]), 100, seed=0, world_size=4)


def test_resume_from_a_position():
    src, tgt = lengths(2000)
    sampler = TokenBatchSampler(src, tgt, 700, seed=9, rank=1, world_size=2)
    sampler.set_epoch(3)
    full = list(sampler)
    assert list(sampler.iter_from(3, 5)) == full[5:]

    sampler.set_epoch(3)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]
    state = sampler.state_dict()
    assert state["epoch"] == 3 and state["position"] == 4

    fresh = TokenBatchSampler(src, tgt, 700, seed=9, rank=1, world_size=2)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    assert list(fresh) == full  # the next iteration starts the epoch from the beginning again
    with pytest.raises(ValueError, match="cannot resume batching: seed was 9, now 10"):
        TokenBatchSampler(src, tgt, 700, seed=10, rank=1, world_size=2).load_state_dict(state)


def test_padding_stats_on_a_hand_example():
    # one batch of two pairs: src lengths 2, 4 -> 2 * 5 positions, 3 + 5 real; tgt 3, 3 -> 2 * 4, all real
    stats = padding_stats(TokenBatchSampler(np.array([2, 4]), np.array([3, 3]), 100, seed=0))
    assert stats["batches"] == 1 and stats["sentences"] == 2
    assert stats["src_padding_share"] == pytest.approx(2 / 10)
    assert stats["tgt_padding_share"] == 0
    assert stats["padding_share"] == pytest.approx(2 / 18)
    assert stats["max_src_cost"] == 10 and stats["max_tgt_cost"] == 8


def test_empty_sampler():
    sampler = TokenBatchSampler(np.zeros(0, int), np.zeros(0, int), 100, seed=0)
    assert list(sampler) == [] and len(sampler) == 0 and padding_stats(sampler)["batches"] == 0


# ----------------------------------------------------------------------------------------------------------------------
# collation


def test_collate_adds_specials_and_pads_right():
    batch = collate([(np.array([5, 6, 7]), np.array([8, 9])), ([10], [11, 12, 13, 14])])
    assert isinstance(batch, Batch) and len(batch) == 2
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.n_src_tokens == 6 and batch.n_tgt_tokens == 8
    assert batch.n_tgt_tokens == int((batch.tgt_out != PAD_ID).sum())
    moved = batch.to("cpu")
    assert torch.equal(moved.src, batch.src) and moved.n_tgt_tokens == 8


def test_collate_with_empty_sequences_and_other_ids():
    batch = collate([([], [])], pad_id=9, bos_id=7, eos_id=8)
    assert batch.src.tolist() == [[8]] and batch.tgt_in.tolist() == [[7]] and batch.tgt_out.tolist() == [[8]]


def test_scan_counts_lines_and_finds_invalid_utf8_fast(tmp_path):
    from transduce.text.textio import scan_text

    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfok\nbad \xff\nfine\nalso \xc3\x28 bad\nlast")
    scan = scan_text(path)
    assert (scan.lines, scan.invalid) == (5, 2)
    assert scan.first_invalid == f"{path}, line 2: not valid UTF-8 (byte 0xff at column 5)"
    path.write_bytes(b"\xef\xbb\xbf\xff\n")
    assert scan_text(path).first_invalid == f"{path}, line 1: not valid UTF-8 (byte 0xff at column 1)"
    with pytest.raises(DataError, match="column 1"):
        list(read_lines(path))


def test_scan_of_text_that_is_not_utf8_takes_linear_time(tmp_path):
    import time

    from transduce.text.textio import scan_text

    # 1 MiB of Latin-1 (one block of the scan), every line with a byte that is not UTF-8, and a valid line between
    line = "Straße café naïve\n".encode("latin-1") + b"plain line\n"
    path = tmp_path / "latin1.txt"
    path.write_bytes(line * ((1 << 20) // len(line)))
    started = time.perf_counter()
    scan = scan_text(path)
    seconds = time.perf_counter() - started
    assert (scan.lines, scan.invalid) == (2 * ((1 << 20) // len(line)), (1 << 20) // len(line))
    assert scan.first_invalid == f"{path}, line 1: not valid UTF-8 (byte 0xdf at column 5)"
    assert seconds < 1.0  # about 0.01 s; copying the rest of the block for every bad line took over 5 s


def test_scan_reports_the_first_bad_byte_of_each_line_across_multibyte_text(tmp_path):
    from transduce.text.textio import _invalid_lines

    # valid multi-byte characters before the bad bytes shift the byte offsets away from the character offsets
    text = "😀 ok\n".encode() + "é é ".encode() + b"\xff\xfe x\n" + "ü".encode() + b"\xc3\x28\xff\nfine\n\xe2\x82\n"
    assert _invalid_lines(text) == [text.index(b"\xff"), text.index(b"\xc3\x28"), text.index(b"\xe2\x82")]
    assert _invalid_lines("😀 ok\n".encode()) == []


def test_standard_input_is_read_the_same_way_and_left_open(monkeypatch):
    import io
    import sys

    stdin = io.TextIOWrapper(io.BytesIO("one\u2028still one\r\ntwo\n".encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert list(read_lines("-")) == [(1, "one\u2028still one"), (2, "two")]
    assert not stdin.buffer.closed
