"""Data parallelism: 2 CPU processes (gloo, via torchrun) equal one process trained on the union of their batches."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from trainkit import toy_config, write_corpus
from transduce.training import checkpoint as ckpt
from transduce.training.runlog import read_metrics

_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from transduce.config import Config, ModelConfig, TrainConfig
    from transduce.data import collate
    from transduce.training.distributed import leave, setup, teardown
    from transduce.model import Transformer
    from transduce.training.trainer import Trainer

    torch.set_num_threads(1)
    # bias=False: the gradient of an attention key bias is exactly zero in theory (softmax ignores a constant
    # added to every score) and float noise in practice, which Adam's normalisation would blow up to +-lr
    config = Config(
        model=ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30, dropout=0.0, bias=False),
        train=TrainConfig(warmup_steps=4, clip_norm=1.0, lr_scale=0.1, precision="fp32"),  # peak lr 0.009
    )

    def global_batches(step):
        # 4 batches per update with different token counts: the loss must be normalised by all of them
        g = torch.Generator().manual_seed(step)
        out = []
        for size in (3, 5, 2, 6):
            pairs = []
            for _ in range(size):
                n = int(torch.randint(2, 9, (1,), generator=g))
                pairs.append((torch.randint(4, 30, (n,), generator=g).tolist(),
                              torch.randint(4, 30, (n + 1,), generator=g).tolist()))
            out.append(collate(pairs))
        return out

    dist = setup("cpu")
    torch.manual_seed(0)
    model = Transformer(config.model)
    trainer = Trainer(config, model, torch.device("cpu"), dist)
    losses = []
    for step in range(4):
        batches = global_batches(step)
        mine = batches[dist.rank :: dist.world_size]  # rank r: batches r, r + 2 (accumulated); 1 process: all 4
        losses.append(trainer.train_step(mine).loss)
    if dist.is_main:
        torch.save({"params": model.state_dict(), "losses": losses}, sys.argv[1])
    teardown()
    leave(0)  # (as `transduce train` does: gloo's threads can abort the interpreter's finalisation)
    """
)


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


def _torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def test_two_processes_equal_one_process_on_the_union_of_their_batches(tmp_path):
    script = tmp_path / "ddp_step.py"
    script.write_text(_SCRIPT)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, str(script), str(one)], check=True, timeout=120, env=_env())
    proc = subprocess.run(_torchrun(str(script), str(two)), capture_output=True, text=True, timeout=180, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = torch.load(one, weights_only=True), torch.load(two, weights_only=True)
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)
    moved = 0
    for name, value in a["params"].items():
        assert torch.allclose(value, b["params"][name], rtol=1e-5, atol=1e-6), name
        moved += 1
    assert moved > 10


def test_torchrun_transduce_train_writes_one_run_directory(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    config = toy_config(corpus, run, tmp_path / "prepared", max_steps=6, valid_every=3, max_tokens=128)
    config.save(tmp_path / "ddp.yaml")
    cmd = _torchrun("-m", "transduce.cli", "train", str(tmp_path / "ddp.yaml"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_00000003", "step_00000006"]
    train_events = read_metrics(run / "metrics.jsonl", "train")
    assert [e["step"] for e in train_events] == [1, 2, 3, 4, 5, 6]  # written once, by rank 0
    valid = read_metrics(run / "metrics.jsonl", "valid")
    assert len(valid) == 2 and valid[-1]["sentences"] == 20 and "bleu" in valid[-1]
    state = ckpt.load_trainer_state(run / "checkpoints" / "step_00000006")
    assert state["world_size"] == 2 and len(state["rng"]) == 2  # every rank's random state is kept


def test_leave_flushes_output_and_exits_with_the_code():
    code = "from transduce.training.distributed import leave\nprint('written before leaving')\nleave(3)\nprint('never')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 3
    assert proc.stdout == "written before leaving\n"  # (a pipe's buffer that os._exit alone would have lost)
