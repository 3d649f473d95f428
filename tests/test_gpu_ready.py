"""The GPU and multi-process path, tested on the CPU: DDP with a positional table grown during validation,
process-group timeouts, RNG states of one device, host synchronisations per micro-batch, fp16 loss scaling,
device names and the kernel build lock."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

_DDP_VALIDATION_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from transduce.config import Config, DecodeConfig, ModelConfig, TrainConfig
    from transduce.data import collate
    from transduce.distributed import leave, setup, teardown
    from transduce.model import Transformer
    from transduce.search import generate
    from transduce.trainer import Trainer

    torch.set_num_threads(1)
    config = Config(model=ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30), train=TrainConfig())
    dist = setup("cpu")
    torch.manual_seed(0)
    model = Transformer(config.model)
    trainer = Trainer(config, model, torch.device("cpu"), dist)
    batch = collate([([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])])
    losses = [trainer.train_step([batch]).loss]
    # validation: greedy decoding past the table's 256 positions under inference_mode, on rank 0 only (the ranks'
    # tables now differ in size)
    model.eval()
    if dist.rank == 0:
        long = DecodeConfig(beam=1, min_len=300, max_len_a=0.0, max_len_b=300)
        hyp = generate(model, torch.tensor([[5, 6, 7, 2]]), long)[0][0]
        assert len(hyp.tokens) == 300, len(hyp.tokens)
    for _ in range(2):
        losses.append(trainer.train_step([batch]).loss)
    if dist.is_main:
        torch.save(losses, sys.argv[1])
    teardown()
    leave(0)
    """
)


def _env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), **extra}


def _torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]


def test_ddp_trains_on_after_validation_decoded_past_the_position_table(tmp_path):
    script = tmp_path / "ddp_valid.py"
    script.write_text(_DDP_VALIDATION_SCRIPT)
    out = tmp_path / "losses.pt"
    proc = subprocess.run(_torchrun(2, str(script), str(out)), capture_output=True, text=True, timeout=240,
                          env=_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = torch.load(out, weights_only=True)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
