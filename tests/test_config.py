"""Configuration: round trips, presets, validation messages, overrides."""

from pathlib import Path

import pytest

from transduce.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, TrainConfig, apply_overrides


def test_model_config_round_trips_exactly_through_json_and_yaml():
    cfg = ModelConfig.preset("tiny", src_vocab_size=8000, tgt_vocab_size=8000, norm="pre", layer_norm_eps=1e-6)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert ModelConfig.from_yaml(cfg.to_yaml()) == cfg
    full = Config(model=cfg, decode=DecodeConfig(beam=5, length_penalty=1.0))
    full.data.test = ["a/test_2016_flickr", "a/test_2017"]
    assert Config.from_yaml(full.to_yaml()) == full
    assert Config.from_json(full.to_json()) == full


def test_presets():
    tiny = ModelConfig.preset("tiny")
    assert (tiny.encoder_layers, tiny.decoder_layers, tiny.d_model, tiny.d_ff, tiny.heads, tiny.dropout) == (
        4,
        4,
        128,
        256,
        4,
        0.3,
    )
    big = ModelConfig.preset("big")
    assert (big.d_model, big.d_ff, big.heads, big.d_k, big.dropout) == (1024, 4096, 16, 64, 0.3)
    assert ModelConfig() == ModelConfig.preset("base")
    with pytest.raises(ConfigError, match=r"unknown model preset 'smal'; did you mean 'small'\?"):
        ModelConfig.preset("smal")


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown key 'd_modle'; did you mean 'd_model'\?"):
        ModelConfig.from_dict({"d_modle": 256})
    several = r"^unknown key 'train.warmup'; did you mean 'train.warmup_steps' or 'train.warmup_by'\? \(valid keys: "
    with pytest.raises(ConfigError, match=several + "run_dir, seed, "):  # every key the name begins, in field order
        Config.from_dict({"train": {"warmup": 10}})
    with pytest.raises(ConfigError, match=r"unknown key 'modle'; did you mean 'model'\?"):
        Config.from_dict({"modle": {}})


def test_types_and_choices_are_checked_with_the_key_named():
    with pytest.raises(ConfigError, match=r"model.heads: expected an integer, got str 'four'"):
        Config.from_dict({"model": {"heads": "four"}})
    with pytest.raises(ConfigError, match=r"norm: 'middle' is not one of 'post', 'pre'"):
        ModelConfig(norm="middle")
    with pytest.raises(ConfigError, match="heads: d_model 100 is not divisible by heads 8"):
        ModelConfig(d_model=100)
    with pytest.raises(ConfigError, match="share_vocab: true needs src_vocab_size == tgt_vocab_size"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=12)
    with pytest.raises(ConfigError, match=r"precision: 'fp8' is not one of 'auto', 'fp32', 'bf16', 'fp16'"):
        TrainConfig(precision="fp8")
    assert TrainConfig.from_dict({"peak_lr": 1}).peak_lr == 1.0  # an integer is a valid float
    assert TrainConfig.from_dict({"peak_lr": "1e-3"}).peak_lr == 0.001  # YAML reads 1e-3 as a string
    with pytest.raises(ConfigError, match=r"peak_lr: expected a number, got str 'fast'"):
        TrainConfig.from_dict({"peak_lr": "fast"})


def test_yaml_file_with_preset_and_dotted_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  preset: tiny\n  src_vocab_size: 8000\n  tgt_vocab_size: 8000\ntrain:\n  accumulate: 2\n")
    cfg = Config.load(path, ["model.dropout=0.2", "train.precision=bf16", "decode.beam=5", "data.test=[a, b]"])
    assert cfg.model.d_model == 128 and cfg.model.dropout == 0.2 and cfg.model.src_vocab_size == 8000
    assert cfg.train.accumulate == 2 and cfg.train.precision == "bf16" and cfg.decode.beam == 5
    assert cfg.data.test == ["a", "b"]
    with pytest.raises(ConfigError) as info:
        Config.load(path, ["model.dropout=0.2", "train.acumulate=3"])
    assert str(info.value).startswith(
        "command-line override 'train.acumulate=3': unknown key 'train.acumulate'; did you mean 'train.accumulate'? "
        "(valid keys: run_dir, seed,"
    )
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        Config.load(tmp_path / "missing.yaml")


def test_files_that_are_not_configs_get_an_error_naming_the_path(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(
        ConfigError,
        match=r"runs: is a directory, not a config file \(to continue a training run: transduce train --resume DIR\)",
    ):
        Config.load(tmp_path / "runs")
    text = tmp_path / "train.en"
    text.write_text("A man rides a bike.\n")
    with pytest.raises(ConfigError, match=r"train.en: a config is a YAML mapping of sections .*, got str"):
        Config.load(text, ["train.seed=2"])
    binary = tmp_path / "train.en.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(ConfigError, match=r"train.en.gz: not a UTF-8 text file \(byte 2\), so not a YAML config"):
        Config.load(binary)
    with pytest.raises(ConfigError, match="a config is a mapping of sections .*, got list"):
        Config.from_dict([1, 2])
    with pytest.raises(ConfigError, match="a config is a mapping of sections .*, got str"):
        apply_overrides("model", ["train.seed=2"])


def test_length_norm_is_a_choice():
    assert DecodeConfig().length_norm == "gnmt"  # the paper's (tensor2tensor's) penalty
    assert DecodeConfig(length_norm="length").length_norm == "length"
    with pytest.raises(ConfigError, match=r"^length_norm: 'average' is not one of 'gnmt', 'length'$"):
        DecodeConfig(length_norm="average")


@pytest.mark.parametrize(
    "section, field, value",
    [
        (DecodeConfig, "max_len_a", float("inf")),  # would clamp every maximum length to 0: empty translations
        (DecodeConfig, "length_penalty", float("nan")),
        (DecodeConfig, "temperature", float("inf")),
        (DecodeConfig, "top_p", float("nan")),
        (TrainConfig, "peak_lr", float("nan")),
        (TrainConfig, "max_minutes", float("inf")),
        (TrainConfig, "max_steps", -1),
    ],
)
def test_non_finite_numbers_are_refused(section, field, value):
    with pytest.raises(ConfigError, match=rf"^{field}: must be "):
        section(**{field: value})
    assert TrainConfig(max_steps=10**400).max_steps == 10**400  # a huge integer is finite (math.isfinite overflows)


def test_non_finite_numbers_in_a_config_file_name_the_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("decode:\n  max_len_a: .inf\n")
    with pytest.raises(ConfigError, match=r"run.yaml: decode.max_len_a: must be a finite number >= 0, got inf"):
        Config.load(path)


def test_overrides_do_not_change_their_input():
    data = {"train": {"seed": 1}}
    assert apply_overrides(data, ["train.seed=2"]) == {"train": {"seed": 2}}
    assert data == {"train": {"seed": 1}}
    with pytest.raises(ConfigError, match="expected section.key=value"):
        apply_overrides(data, ["train.seed"])


@pytest.mark.parametrize("name", ["example", "toy", "multi30k_en_de", "multi30k_de_en", "multi30k_en_fr"])
def test_shipped_configs_load(name):
    root = Path(__file__).parents[1] / "configs"
    cfg = Config.load(root / f"{name}.yaml")
    if name.startswith("multi30k"):
        src, tgt = name.split("_")[1:]
        assert (cfg.data.src_lang, cfg.data.tgt_lang, cfg.model.norm) == (src, tgt, "pre")
        assert cfg.data.train.endswith("multi30k/train") and cfg.train.run_dir == f"runs/{name}"


def test_the_multilingual_multi30k_config_loads():
    cfg = Config.load(Path(__file__).parents[1] / "configs" / "multi30k_en_defrcs.yaml")
    assert (cfg.data.src_lang, cfg.data.tgt_langs, cfg.model.norm) == ("en", ["de", "fr", "cs"], "pre")
    assert cfg.data.train.endswith("multi30k/train") and cfg.train.run_dir == "runs/multi30k_en_defrcs"
    assert cfg.decode.tgt_lang == ""  # a request names its language


def test_errors_name_their_source_file_or_command_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  warmup: 3\n")
    with pytest.raises(
        ConfigError, match=r"^.*run.yaml: unknown key 'train.warmup'; did you mean 'train.warmup_steps'"
    ):
        Config.load(path, ["train.seed=2"])  # the file is wrong by itself, whatever the overrides
    path.write_text("train:\n  schedule: cosine\n  warmup_steps: 100\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path, ["train.seed=2", "train.max_steps=50", "train.threads=1"])
    assert str(info.value) == (
        "command-line override 'train.max_steps=50': train.max_steps: the cosine schedule decays from warmup_steps to "
        "max_steps, so max_steps must exceed warmup_steps (100), got 50"
    )
    with pytest.raises(ConfigError, match=r"^command-line override 'train.seed': expected section.key=value$"):
        Config.load(path, ["train.seed"])
    with pytest.raises(ConfigError, match=r"^command-line options: data.tgt_lang: source and target language are both"):
        Config.load(path, options={"data": {"src_lang": "de"}})
    assert Config.resolve({}, ["train.seed=3"], options={"data": {"train": "x.tsv"}}).train.seed == 3


def test_unknown_preset_and_choice_suggest_the_closest_and_are_not_garbled(tmp_path):
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"model": {"preset": "smal", "dropout": 0.2}})
    assert str(info.value) == (
        "model.preset: unknown model preset 'smal'; did you mean 'small'? (valid presets: base, big, small, tiny, test)"
    )
    with pytest.raises(ConfigError) as info:
        Config.resolve({}, ["model.preset=bgi"])
    assert str(info.value) == (
        "command-line override 'model.preset=bgi': model.preset: unknown model preset 'bgi'; did you mean 'big'? "
        "(valid presets: base, big, small, tiny, test)"
    )
    with pytest.raises(ConfigError, match=r"^model.preset: unknown model preset 'xyz' \(valid presets: base, "):
        Config.from_dict({"model": {"preset": "xyz"}})
    with pytest.raises(ConfigError, match=r"^unknown key 'model.d_modle'; did you mean 'model.d_model'\? \(valid"):
        Config.from_dict({"model": {"preset": "tiny", "d_modle": 64}})
    with pytest.raises(ConfigError) as info:
        ModelConfig(activation="rleu")
    assert str(info.value) == "activation: 'rleu' is not one of 'relu', 'gelu', 'swish'; did you mean 'relu'?"


def test_data_corpus_forms_are_validated():
    assert DataConfig(train=["a.src", "b.tgt"], test=["t.tsv", ["x", "y"]]).test == ["t.tsv", ["x", "y"]]
    with pytest.raises(ConfigError, match=r"^data.train: two files are \[source, target\], got 3 paths$"):
        Config.from_dict({"data": {"train": ["a", "b", "c"]}})
    with pytest.raises(ConfigError, match=r"^data.test\[1\]: two files are \[source, target\], got 1 paths$"):
        Config.from_dict({"data": {"test": ["a", ["b"]]}})
    with pytest.raises(ConfigError, match=r"^src_field: must name a field \(a, or a.b for a nested one\), got 'a..b'$"):
        DataConfig(src_field="a..b")
    assert Config.from_dict({"data": {"train": ["s", "t"]}}).to_yaml().count("- s") == 1  # round-trips as a list
