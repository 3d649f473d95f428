"""The GPU and multi-process path, tested on the CPU: DDP with a positional table grown during validation,
process-group timeouts, RNG states of one device, host synchronisations per micro-batch, fp16 loss scaling,
device names and the kernel build lock."""

import math
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
    from transduce.training.distributed import leave, setup, teardown
    from transduce.model import Transformer
    from transduce.search import generate
    from transduce.training.trainer import Trainer

    torch.set_num_threads(1)
    model = ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30)
    config = Config(model=model, train=TrainConfig(precision="fp32"))
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


# ----------------------------------------------------------------------------------------------------------------------
# process group, RNG, synchronisations, fp16


def _trainer(dropout_free: bool = False, **train):
    from transduce.config import Config, ModelConfig, TrainConfig
    from transduce.model import Transformer
    from transduce.training.trainer import Trainer

    extra = {"dropout": 0.0} if dropout_free else {}
    config = Config(
        model=ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30, **extra),
        train=TrainConfig(**{"warmup_steps": 10, "precision": "fp32", **train}),
    )
    torch.manual_seed(0)
    return Trainer(config, Transformer(config.model), torch.device("cpu"))


def _batches(n):
    from transduce.data import collate

    g = torch.Generator().manual_seed(n)
    out = []
    for _ in range(n):
        lengths = torch.randint(2, 9, (3,), generator=g).tolist()
        pairs = [(torch.randint(4, 30, (k,), generator=g).tolist(), torch.randint(4, 30, (4,), generator=g).tolist())
                 for k in lengths]  # fmt: skip
        out.append(collate(pairs))
    return out


def test_the_process_group_gets_the_configured_timeout_and_shared_gpus_use_gloo(monkeypatch):
    import datetime

    import transduce.training.distributed as d

    seen = []
    monkeypatch.setattr(d.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(d.dist, "init_process_group", lambda **kw: seen.append(kw))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    dist = d.setup("cpu", 90.0)
    assert (dist.rank, dist.world_size, dist.local_rank) == (1, 2, 1)
    assert seen == [{"backend": "gloo", "timeout": datetime.timedelta(minutes=90)}]
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    d.setup(torch.device("cuda", 0), 5.0, shared_gpu=True)  # two ranks on one GPU: NCCL refuses it
    assert seen[-1]["backend"] == "gloo"
    d.setup(torch.device("cuda"), 5.0)
    assert seen[-1] == {"backend": "nccl", "timeout": datetime.timedelta(minutes=5)}


def test_cuda_rng_state_is_this_device_only_and_restores_with_fewer_visible_gpus(monkeypatch):
    from transduce.training.trainer import rng_state, set_rng_state

    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]
    current = {"device": 3, "count": 8}
    restored = []

    def set_state(state, device="cuda"):
        index = current["device"] if device == "cuda" else int(device)
        if index >= current["count"]:
            raise IndexError(f"no GPU {index}")
        restored.append((index, state.clone()))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: current["count"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["device"])
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[current["device"]])
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    saved = rng_state()  # a rank on GPU 3 of 8
    current.update(device=0, count=1)  # resumed as one GPU per task (SLURM, CUDA_VISIBLE_DEVICES)
    set_rng_state(saved)
    assert len(restored) == 1 and restored[0][0] == 0 and torch.equal(restored[0][1], states[3])


_SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


def _count_syncs(monkeypatch, fn):
    """Calls that read a tensor's value back to the host (on a GPU each waits for the queue), and boolean-mask
    indexing (which reads the mask's count), made while ``fn`` runs."""
    count = {"n": 0, "what": []}
    for name in _SYNCS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **k):
            count["n"] += 1
            count["what"].append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for name in ("__getitem__", "__setitem__"):
        real = getattr(torch.Tensor, name)

        def indexed(self, index, *a, _real=real, _name=name):
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
                count["n"] += 1
                count["what"].append(_name)
            return _real(self, index, *a)

        monkeypatch.setattr(torch.Tensor, name, indexed)
    fn()
    monkeypatch.undo()
    return count


def test_a_training_step_reads_the_device_once_however_many_micro_batches(monkeypatch):
    from transduce import fastpaths

    # the GPU's code path on the CPU: SDPA, no CPU kernels, no dropout (the CPU draws its dropout seeds on the host)
    monkeypatch.setattr(fastpaths.settings, "kernels", False)
    monkeypatch.setattr(fastpaths.settings, "explicit_attention_max_keys", 0)
    counts = {}
    for n in (1, 4):
        trainer = _trainer(dropout_free=True, clip_norm=1.0)  # GPUs drop out with F.dropout: no seed read
        trainer.optimizer.step = _outside(trainer.optimizer.step)  # the CPU optimizer reads its CPU step counters
        batches = _batches(n)
        with monkeypatch.context() as m:
            counts[n] = _count_syncs(m, lambda t=trainer, b=batches: t.train_step(b, [1.0, 0.0]))
        assert trainer.step == 1
    assert counts[1]["n"] == counts[4]["n"] == 1, (counts[1]["what"], counts[4]["what"])


def _outside(fn):
    """``fn`` run with the counted methods restored (their real versions are the class's originals)."""
    originals = {name: getattr(torch._C.TensorBase, name) for name in _SYNCS if hasattr(torch._C.TensorBase, name)}

    def run(*a, **k):
        saved = {name: torch.Tensor.__dict__.get(name) for name in originals}
        for name in originals:
            if name in torch.Tensor.__dict__:
                delattr(torch.Tensor, name)
        try:
            return fn(*a, **k)
        finally:
            for name, value in saved.items():
                if value is not None:
                    setattr(torch.Tensor, name, value)

    return run


def test_fp16_scales_the_loss_lowers_the_scale_after_an_overflow_and_checkpoints_it(tmp_path):
    trainer = _trainer(precision="fp16")
    assert trainer.scaler is not None and trainer.scaler.get_scale() == 128.0
    batches = _batches(2)
    result = trainer.train_step(batches)
    assert not result.skipped and trainer.step == 1 and math.isfinite(result.loss)
    eager = _trainer(precision="fp32")  # the unscaled gradient: the same step as without scaling, up to fp16
    assert result.loss == pytest.approx(eager.train_step(batches).loss, rel=2e-2)
    hook = trainer.model.output.weight.register_hook(lambda g: torch.full_like(g, math.inf))
    overflow = trainer.train_step(batches)
    hook.remove()
    assert overflow.skipped and overflow.overflow and trainer.step == 1
    assert trainer.nonfinite_in_row == 0 and trainer.scaler.get_scale() == 64.0
    torch.save(trainer.state_dict(), path := tmp_path / "trainer.pt")  # as a checkpoint keeps it
    state = torch.load(path, weights_only=True)
    assert state["scaler"]["scale"] == 64.0
    fresh = _trainer(precision="fp16")
    fresh.load_state_dict(state)
    assert fresh.scaler.get_scale() == 64.0 and fresh.step == 1


def test_flags_are_summed_in_the_step_and_returned():
    result = _trainer().train_step(_batches(1), [1.0, 0.0, 2.0])
    assert result.flags == (1.0, 0.0, 2.0)


# ----------------------------------------------------------------------------------------------------------------------
# devices and precisions


def test_device_names_resolve_or_fail_in_one_line(monkeypatch):
    from transduce.config import ConfigError, TrainConfig
    from transduce.device import DeviceError, check_precision, resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") in (torch.device("cpu"), torch.device("mps"))
        with pytest.raises(DeviceError, match=r"^device: 'cuda' asked for, but .*use --device cpu"):
            resolve_device("cuda")
    with pytest.raises(DeviceError, match=r"'gpu' is not a device \(auto, cpu, cuda, cuda:N or mps\)"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)
    with pytest.raises(DeviceError, match=r"'cuda:2' asked for GPU 2, but 2 GPU\(s\) are visible"):
        resolve_device("cuda:2")
    assert TrainConfig(device="cuda:1").device == "cuda:1" and TrainConfig(device="mps").device == "mps"
    with pytest.raises(ConfigError, match="device: 'cuda1' is not a device"):
        TrainConfig(device="cuda1")
    assert check_precision("fp16") == torch.float16
    with pytest.raises(DeviceError, match="precision: 'fp8' is not one of fp32, bf16, fp16"):
        check_precision("fp8")


def test_one_visible_gpu_per_process_is_cuda_0_whatever_the_local_rank(monkeypatch):
    """torchrun or SLURM with CUDA_VISIBLE_DEVICES set per rank: each process sees its own GPU as cuda:0."""
    from transduce.device import DeviceError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 0)
    with pytest.raises(DeviceError, match=r"^device: 'cuda:1' asked for GPU 1, but 1 GPU\(s\) are visible "
                                          r"\(CUDA_VISIBLE_DEVICES=3\)$"):  # fmt: skip
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # several visible: local rank k takes GPU k
    with pytest.raises(DeviceError, match=r"^device: 'cuda' asked for GPU 2 \(the local rank\), but 2 GPU\(s\) "
                                          r"are visible"):  # fmt: skip
        resolve_device("cuda", local_rank=2)


@pytest.mark.parametrize("value", ["abc", "", "-5", "nan", "inf"])
def test_a_malformed_kernel_wait_warns_and_uses_the_default(value):
    code = "import transduce.model.kernels as k; print(k.BUILD_WAIT_S)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_env(TRANSDUCE_KERNEL_WAIT=value))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "300.0\n"
    warning = [line for line in proc.stderr.splitlines() if "TRANSDUCE_KERNEL_WAIT" in line]
    assert warning == [f"TRANSDUCE_KERNEL_WAIT={value!r} is not a number of seconds >= 0; waiting at most 300 s "
                       "for another process's kernel build"]  # fmt: skip


def test_a_valid_kernel_wait_is_taken_without_a_word():
    code = "import transduce.model.kernels as k; print(k.BUILD_WAIT_S)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_env(TRANSDUCE_KERNEL_WAIT="2.5"))  # fmt: skip
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "2.5\n", "")


def test_cli_device_cuda_without_cuda_is_a_one_line_error(copy_checkpoint, capsys):
    from transduce.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["translate", "--model", str(copy_checkpoint), "--device", "cuda", "--input", os.devnull])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("transduce translate: error: device: 'cuda' asked for, but")


def test_translator_precisions_cast_the_weights_and_translate_alike(copy_checkpoint):
    from transduce.config import ConfigError
    from transduce.search.translator import Translator

    sentences = ["a man rides the red bike.", "two girls play on grass."]  # what the copy model learnt
    fp32 = Translator.load(copy_checkpoint, "cpu")
    assert fp32.device == torch.device("cpu") and next(fp32.model.parameters()).dtype == torch.float32
    from transduce import fastpaths

    with fastpaths.override(bf16_min_weights=0):  # every linear layer in bf16 (the copy model's are small)
        bf16 = Translator.load(copy_checkpoint, "auto" if not torch.cuda.is_available() else "cpu", precision="bf16")
    if bf16.device.type == "cpu":  # bf16 linear layers, the rest float32 (transduce.model.bf16)
        assert {p.dtype for p in bf16.model.parameters()} == {torch.float32, torch.bfloat16}
        assert bf16.model.output.weight.dtype == torch.bfloat16
        assert bf16.model.src_positions.table.dtype == torch.float32
    else:
        assert next(bf16.model.parameters()).dtype == torch.bfloat16
        assert bf16.model.src_positions.table.dtype == torch.bfloat16
    assert bf16.translate(sentences) == fp32.translate(sentences) == sentences
    with pytest.raises(ConfigError, match="quantize: 'int8' runs with precision fp32, not fp16"):
        Translator.load(copy_checkpoint, "cpu", precision="fp16", quantize="int8")


def test_gpu_check_runs_its_cpu_half(tmp_path):
    """benchmarks/gpu_check.py --cpu: torchrun training in bf16 and fp16 (1 and 2 processes), exact resume,
    translations, throughput against torch.nn.Transformer and MarianMTModel."""
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script), "--cpu", "--steps", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["runs"]) == {"bf16_x1", "fp16_x1", "bf16_x2"}
    assert all("error" not in r and math.isfinite(r["loss"]) for r in report["runs"].values())
    assert report["checks"]["resume_exact"] is True and report["checks"]["decode_equal_to_cpu"] == "20/20"
    assert {"transduce", "torch.nn.Transformer"} <= set(report["throughput_bf16"])


def test_compiled_training_traces_one_graph_for_batches_of_every_shape(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters

    from transduce import fastpaths
    from transduce.data import collate

    # the GPU's code path on the CPU (no CPU kernels, which the tracer cannot enter), with dynamo's eager backend:
    # what is compiled and how often, without the time of generating code
    monkeypatch.setattr(fastpaths.settings, "kernels", False)
    monkeypatch.setattr(fastpaths.settings, "explicit_attention_max_keys", 0)
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend="eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    compiled, eager = _trainer(compile=True, dropout_free=True), _trainer(dropout_free=True)
    g = torch.Generator().manual_seed(0)
    for step in range(6):  # a new shape every step, padded and not
        pairs = [(torch.randint(4, 30, (3 + step + (i % 2),), generator=g).tolist(),
                  torch.randint(4, 30, (2 + 2 * step,), generator=g).tolist()) for i in range(2 + step)]  # fmt: skip
        batch = collate(pairs)
        assert compiled.train_step([batch]).loss == pytest.approx(eager.train_step([batch]).loss, rel=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


def test_prefetch_yields_the_source_in_order_raises_its_errors_and_stops():
    import threading

    from transduce.data import collate
    from transduce.data.prefetch import Prefetch

    batch = collate([([5, 6], [7])])
    items = [(0, i, batch) for i in range(1, 6)]
    assert [p for _, p, _ in Prefetch(iter(items), depth=2, pin=None)] == [1, 2, 3, 4, 5]

    def failing():
        yield items[0]
        raise ValueError("bad line 7")

    it = Prefetch(failing(), depth=2, pin=None)
    assert next(it)[1] == 1
    with pytest.raises(ValueError, match="bad line 7"):
        next(it)

    def endless():
        while True:
            yield items[0]

    before = threading.active_count()
    it = Prefetch(endless(), depth=3, pin=None)
    next(it)
    it.close()
    assert threading.active_count() == before


def test_gpu_check_reads_every_corpus_from_its_data_directory(tmp_path, monkeypatch):
    """The GPU half trains the base model on --data alone: no corpus of the Multi30k config (its test set under
    ../shared) may be read from anywhere else, and the config's time-budget schedule does not apply."""
    import argparse
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    config = gpu_check.base_config(argparse.Namespace(cpu=False), tmp_path)
    assert (config.data.train, config.data.valid, config.data.test) == (str(tmp_path / "train"),
                                                                        str(tmp_path / "val"), [])  # fmt: skip
    model = config.model
    assert (model.encoder_layers, model.d_model, model.d_ff, model.heads, model.norm) == (6, 512, 2048, 8, "post")
    assert (config.train.schedule, config.train.max_minutes) == ("inverse_sqrt", 0.0)
