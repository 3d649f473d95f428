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


# ----------------------------------------------------------------------------------------------------------------------
# the kernel build lock

_LOAD_KERNELS = (
    "import time, warnings; t = time.monotonic(); warnings.simplefilter('always')\n"
    "from transduce.model import kernels\n"
    "m = kernels.compiled(); print('LOADED' if m is not None else 'FALLBACK', round(time.monotonic() - t, 1))\n"
)

_KILLED_BUILDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from torch.utils.file_baton import FileBaton
    from transduce.model import kernels

    directory = kernels.build_directory(kernels.extension_name())
    with kernels.build_lock(directory):
        assert FileBaton(str(directory / "lock")).try_acquire()  # what cpp_extension does before it builds
        print("building", flush=True)
        time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def built_kernels():
    from transduce.model import kernels

    if kernels.compiled() is None:
        pytest.skip("the kernels cannot be built here")
    return kernels.build_directory(kernels.extension_name())


def test_a_lock_left_by_a_killed_build_does_not_stop_the_next_command(built_kernels):
    builder = subprocess.Popen([sys.executable, "-c", _KILLED_BUILDER], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert builder.stdout.readline().strip() == "building"
        assert (built_kernels / "lock").exists()
    finally:
        builder.kill()  # SIGKILL: nothing of the builder's runs again
        builder.wait()
    assert (built_kernels / "lock").exists()  # left behind
    proc = subprocess.run([sys.executable, "-c", _LOAD_KERNELS], capture_output=True, text=True, timeout=120,
                          env=_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    word, seconds = proc.stdout.split()
    assert word == "LOADED" and float(seconds) < 20, proc.stdout
    assert "left by a kernel build that was killed" in proc.stderr
    assert not (built_kernels / "lock").exists()


def test_a_live_build_is_waited_for_with_a_bound_then_pytorch_operations_are_used(built_kernels):
    from transduce.model import kernels

    with kernels.build_lock(built_kernels):  # this process is "building"
        proc = subprocess.run([sys.executable, "-c", _LOAD_KERNELS], capture_output=True, text=True, timeout=120,
                              env=_env(TRANSDUCE_KERNEL_WAIT="2"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    word, seconds = proc.stdout.split()
    assert word == "FALLBACK" and 2 <= float(seconds) < 20, proc.stdout
    assert "BuildWaitTimeout" in proc.stderr and "use PyTorch's operations" in proc.stderr


def test_two_python_environments_build_under_different_names(monkeypatch):
    from transduce.model import kernels

    here = kernels.extension_name()
    monkeypatch.setattr(sys, "prefix", "/opt/other-venv")
    assert kernels.extension_name() != here
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert kernels.extension_name() != here
    assert kernels.extension_name().startswith("transduce_kernels_")
