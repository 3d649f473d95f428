"""Bounded training memory (transduce.training.memory): oneDNN's caches capped during training, large tensors from the
block cache within its bound while batch sizes change, and the environment and allocator as they were after the run."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from trainkit import toy_config
from transduce import fastpaths
from transduce.model import kernels
from transduce.training import memory
from transduce.training.train import train
from transduce.training.trainer import Trainer

CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")

needs_kernels = pytest.mark.skipif(kernels.compiled() is None, reason="the block cache is part of the kernels")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (oneDNN reads its cache capacities once per process)."""
    clean = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**clean, **env}, timeout=300)  # fmt: skip


@pytest.mark.skipif(not fastpaths.onednn_available(), reason="oneDNN is not in this PyTorch build")
@pytest.mark.parametrize("capped", [True, False])
def test_a_capped_onednn_cache_compiles_a_shape_again_after_more_new_shapes_than_it_holds(capped):
    # 300 shapes, then the first again: under the caps (256 and 64 entries) it has left both caches and oneDNN
    # compiles it anew; at the default capacities (1,024) it is still cached
    result = _python(f"""
        import contextlib
        import torch
        from transduce.training import memory
        with memory.capped_onednn_caches() if {capped} else contextlib.nullcontext():
            weight = torch.ops.mkldnn._reorder_linear_weight(torch.randn(16, 8))
            for rows in [*range(1, 301), 1]:
                torch.ops.mkldnn._linear_pointwise(torch.randn(rows, 8), weight, None, "none", [], "")
        """, ONEDNN_VERBOSE="profile_create")  # fmt: skip
    assert result.returncode == 0, result.stderr
    first_shape = [line.split(",")[3] for line in result.stdout.splitlines() if ",mb1ic8oc16," in line]
    assert first_shape == ["create:cache_miss", "create:cache_miss" if capped else "create:cache_hit"]


def test_training_caps_onednn_caches_and_leaves_the_environment_as_it_was(data, tmp_path, monkeypatch):
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    seen = []
    step = Trainer.train_step

    def recording_step(self, *args, **kwargs):
        seen.append(tuple(os.environ.get(name) for name in CACHE_VARIABLES))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", recording_step)
    corpus, prepared = data
    train(toy_config(corpus, tmp_path / "run", prepared, max_steps=3, valid_every=0, valid_bleu=False))
    assert set(seen) == {(str(memory.ONEDNN_CACHE_CAPACITY), str(memory.IDEEP_CACHE_CAPACITY))}
    assert all(name not in os.environ for name in CACHE_VARIABLES)


def test_capacities_set_in_the_environment_are_kept(monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    with memory.capped_onednn_caches() as caps:
        assert caps == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "64"}
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024" and "LRU_CACHE_CAPACITY" not in os.environ


@needs_kernels
def test_training_takes_large_tensors_from_the_block_cache_and_gives_the_kept_blocks_back(data, tmp_path, monkeypatch):
    serving = []
    step = Trainer.train_step

    def recording_step(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        serving.append(memory.block_cache_stats()["serving"])
        return result

    monkeypatch.setattr(Trainer, "train_step", recording_step)
    corpus, prepared = data
    before = memory.block_cache_stats().get("maps", 0)
    train(toy_config(corpus, tmp_path / "run", prepared, max_steps=3, valid_every=0, valid_bleu=False))
    after = memory.block_cache_stats()
    assert serving == [1, 1, 1] and after["maps"] > before  # the toy model's embeddings and logits are large
    assert after["serving"] == 0 and after["kept_bytes"] == 0 and after["mapped_bytes"] == after["in_use_bytes"]


@needs_kernels
def test_the_block_cache_stays_within_its_bound_and_reuses_blocks_while_batch_sizes_change():
    rng = random.Random(0)
    with memory.training_memory(torch.device("cpu")) as served:
        assert served
        start = memory.block_cache_stats()
        for _ in range(200):  # an update's large tensors for a batch of B sentences of T tokens, B T <= 4,096
            t = rng.randint(8, 60)
            b = 4096 // t
            tensors = []
            for _layer in range(4):  # activations, feed-forward, attention weights
                tensors += [torch.empty(b * t, 128), torch.empty(b * t, 512), torch.empty(b, 4, t, t)]
            tensors.append(torch.empty(b * t, 2000))  # logits
            stats = memory.block_cache_stats()
            assert stats["mapped_bytes"] <= memory.BLOCK_LIMIT_FACTOR * stats["peak_in_use_bytes"]
            del tensors
        end = memory.block_cache_stats()
    maps, reuses = end["maps"] - start["maps"], end["reuses"] - start["reuses"]
    assert maps + reuses == 200 * 13 and maps < 200 * 13 / 5  # four in five tensors take a block that is there
    after = memory.block_cache_stats()
    assert after["serving"] == 0 and after["kept_bytes"] == 0


@needs_kernels
def test_tensors_from_the_block_cache_outlive_the_run_and_are_unmapped_when_freed():
    with memory.training_memory(torch.device("cpu")):
        kept = torch.full((1 << 18,), 2.0)  # 1 MiB
    assert memory.block_cache_stats()["in_use_bytes"] >= kept.numel() * 4 and float(kept.sum()) == 2.0 * (1 << 18)
    mapped = memory.block_cache_stats()["mapped_bytes"]
    del kept
    assert memory.block_cache_stats()["mapped_bytes"] == mapped - (1 << 20)


@needs_kernels
def test_onednn_memory_made_during_training_is_freed_after_it():
    # oneDNN's tensors are freed through whatever CPU allocator is current then: the cache stays that allocator
    result = _python("""
        import torch
        from transduce.training import memory
        with memory.training_memory(torch.device("cpu")):
            weight = torch.randn(512, 1024).to_mkldnn()
        del weight
        print(memory.block_cache_stats()["mapped_bytes"])
        """)  # fmt: skip
    assert result.returncode == 0 and result.stdout.split() == ["0"], result.stderr


def test_without_the_block_cache_training_uses_the_c_library_allocator():
    with fastpaths.override(block_cache=False), memory.training_memory(torch.device("cpu")) as served:
        assert not served
    with memory.training_memory(torch.device("meta")) as served:
        assert not served
