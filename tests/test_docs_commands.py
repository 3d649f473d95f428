"""The commands the documentation shows are commands this CLI accepts.

Every ``transduce ...`` command in the code blocks of README.md and docs/*.md (continuation lines joined, shell
variables that the documents set expanded), and in the examples of every verb's ``--help``, is checked against the
command line without running it: the verb exists, every option is one the verb lists, the values pass the options'
types, a config file under ``configs/`` exists, and the config that the config file, the options and the dotted
``KEY=VALUE`` overrides describe validates (``Config.load``). A synopsis (``transduce VERB [--flag X] ...``) is
checked for its verb and options. A renamed option, a removed config or an override the config refuses fails here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from transduce.cli import COMMANDS, build_parser
from transduce.config import Config

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# words that may stand before a command in a shell line: `for x in ...; do transduce ...`, `time transduce ...`
WRAPPERS = {"do", "then", "else", "time", "/usr/bin/time", "-v", "nice", "exec"}
# verbs whose positional paths are an older spelling the documents should no longer teach
OLD_POSITIONALS = {"export", "import-hf", "average"}


@dataclass(frozen=True)
class Command:
    where: str  # "docs/cli.md:194" or "transduce train --help"
    argv: tuple[str, ...]  # after `transduce` (or `-m transduce.cli`): the verb first

    def __str__(self) -> str:
        return f"{self.where}: transduce {shlex.join(self.argv)}"


def code_lines(text: str) -> list[tuple[int, str]]:
    """The lines inside fenced code blocks with their line numbers (from 1), backslash continuations joined."""
    lines, inside, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if pending:
            line = line.lstrip()
        else:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


def commands_in(line: str, variables: dict[str, str]) -> list[tuple[str, ...]]:
    """The transduce command lines in one shell line, ``$NAME`` expanded from ``variables`` (which the line's own
    ``NAME=value`` assignments extend)."""
    alternatives = re.sub(r"(?<=[\w-])\|(?=[\w-])", "\0", line)  # a synopsis's hf|ctranslate2 is not a pipe
    try:
        lexer = shlex.shlex(alternatives, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = [token.replace("\0", "|") for token in lexer]
    except ValueError:  # not shell (unbalanced quotes in prose or output)
        return []
    if len(tokens) == 1 and (m := ASSIGNMENT.match(tokens[0])):
        variables[m.group(1)] = expand(m.group(2), variables)
        return []
    tokens = [t for token in tokens for t in expand_words(token, variables)]
    found, previous = [], None
    for i, token in enumerate(tokens):
        command_word = previous is None or is_separator(previous) or previous in WRAPPERS or ASSIGNMENT.match(previous)
        if (token == "transduce" and command_word) or (token == "transduce.cli" and previous == "-m"):
            found.append(arguments(tokens[i + 1 :]))
        previous = token
    return [argv for argv in found if argv and not argv[0].endswith(":")]  # `transduce train: error: ...` is output


def expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), text)


def expand_words(token: str, variables: dict[str, str]) -> list[str]:
    """``$CS`` standing for several words becomes those words (the shell splits an unquoted expansion)."""
    expanded = expand(token, variables)
    return expanded.split() if expanded != token and re.fullmatch(r"\$\{?\w+\}?", token) else [expanded]


def is_separator(token: str) -> bool:
    return bool(token) and all(c in "();<>|&" for c in token)


def arguments(tokens: list[str]) -> tuple[str, ...]:
    """The words of one command: up to a separator or a redirection (``2>`` loses its ``2``)."""
    argv = []
    for i, token in enumerate(tokens):
        if is_separator(token):
            if token.startswith(">") and argv and argv[-1].isdigit() and i and tokens[i - 1] == argv[-1]:
                argv.pop()
            break
        argv.append(token)
    return tuple(argv)


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCUMENTS:
        variables: dict[str, str] = {}
        for number, line in code_lines(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{number}"
            commands += [Command(where, argv) for argv in commands_in(line, variables)]
    for verb, parser in verb_parsers().items():
        help_text = "\n".join(filter(None, (parser.description, parser.epilog)))
        for line in re.sub(r"\\\n\s*", " ", help_text).splitlines():
            if line.strip().startswith(("transduce ", "torchrun ")):
                commands += [Command(f"transduce {verb} --help", argv) for argv in commands_in(line, {})]
    return commands


@functools.cache
def top_parser() -> argparse.ArgumentParser:
    return build_parser()


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in top_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def listed_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def is_synopsis(argv: tuple[str, ...]) -> bool:
    """``transduce train [CONFIG.yaml] [--preset NAME] ...``: a form, not a command."""
    return any(t.startswith("[") or t == "..." or re.fullmatch(r"[a-z0-9-]+(\|[a-z0-9-]+)+", t) for t in argv)


def check(command: Command) -> None:
    """Raise AssertionError naming ``command`` when the CLI would refuse it (or it names what does not exist)."""
    verb, *rest = command.argv
    if verb in ("--help", "-h", "--version"):
        return
    parsers = verb_parsers()
    assert verb in parsers, f"{command}: no verb {verb!r} (verbs: {', '.join(parsers)})"
    listed = listed_options(parsers[verb])
    options = [re.match(r"\[?(-[^\s\]=]*)", t).group(1) for t in rest if re.match(r"\[?--?[A-Za-z]", t)]
    unknown = [o for o in options if o not in listed]
    assert not unknown, f"{command}: {verb} has no option {', '.join(unknown)}"
    if is_synopsis(command.argv) or "--help" in rest or "-h" in rest:
        return
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args, extra = top_parser().parse_known_args(list(command.argv))
    except SystemExit:
        raise AssertionError(f"{command}: refused: {stderr.getvalue().strip()}") from None
    overrides = [*getattr(args, "overrides", []), *extra]
    overridable = hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra)
    assert overridable or not extra, f"{command}: unrecognized arguments {' '.join(extra)}"
    if verb in OLD_POSITIONALS:
        assert not args.paths, f"{command}: the older positional spelling; write --model PATH and -o/--output"
    if verb == "train":
        check_train(command, args, overrides)
    elif verb == "prepare":
        from transduce.commands.prepare import data_config

        args.overrides = overrides
        check_config_file(command, args.config)
        data_config(args)


def check_config_file(command: Command, path: str | None) -> None:
    """A config under configs/ is one of the repository's; any other name is the reader's own file."""
    if path and Path(path).parts[0] == "configs":
        assert (ROOT / path).is_file(), f"{command}: {path} does not exist"


def check_train(command: Command, args: argparse.Namespace, overrides: list[str]) -> None:
    """The config ``transduce train`` would build from these arguments validates (as commands.train.run builds it)."""
    from transduce.commands.train import _options

    if args.config and "=" in args.config:
        overrides.insert(0, args.config)
        args.config = None
    options = _options(args)
    for key in ("device", "precision"):
        if getattr(args, key, None) is not None:
            overrides.append(f"train.{key}={getattr(args, key)}")
    if args.init_from:
        overrides.append(f"train.init_from={args.init_from}")
    check_config_file(command, args.config)
    if args.config and Path(args.config).parts[0] == "configs":
        Config.load(args.config, overrides, options=options)
    else:  # --resume RUN_DIR, the reader's own YAML file, or no file: the overrides on the built-in defaults
        Config.resolve({}, overrides, options=options)


COMMANDS_FOUND = documented_commands()


def test_the_documents_show_commands_of_every_kind():
    """The extraction finds what is there (a change that found nothing would pass every check below)."""
    assert {c.argv[0] for c in COMMANDS_FOUND} == set(COMMANDS)
    assert len(COMMANDS_FOUND) > 60
    sources = {c.where.split(":")[0] for c in COMMANDS_FOUND}
    assert {"README.md", "docs/cli.md", "docs/finetune.md", "docs/multi30k.md", "transduce train --help"} <= sources
    # variables set in a document, continuation lines and a command inside a loop
    (ft,) = [c for c in COMMANDS_FOUND if "train.run_dir=runs/demo/en_cs_ft_mix" in c.argv]
    assert "data.tgt_lang=cs" in ft.argv and "train.max_minutes=20" in ft.argv and ft.argv[-1] == "data.workers=1"
    assert any(c.argv[:3] == ("evaluate", "--model", "runs/demo/$run") for c in COMMANDS_FOUND)


@pytest.mark.parametrize("command", COMMANDS_FOUND, ids=str)
def test_documented_command_is_accepted(command, monkeypatch):
    monkeypatch.chdir(ROOT)
    check(command)


def test_the_checks_catch_what_they_are_for(monkeypatch):
    monkeypatch.chdir(ROOT)
    for line, reason in (
        ("transduce translat --model m", "no verb 'translat'"),
        ("transduce translate --model m --beams 4", "translate has no option --beams"),
        ("transduce translate --model m --out x", "translate has no option --out"),  # hidden: the older spelling
        ("transduce translate --model m --beam 0", "refused: transduce translate: --beam must be >= 1 (got 0)"),
        ("transduce train configs/finetune.yaml", "configs/finetune.yaml does not exist"),
        ("transduce export --format hf runs/a models/b", "the older positional spelling"),
        ("transduce average [--model RUN_DIR] [--lst N]", "average has no option --lst"),
    ):
        (argv,) = commands_in(line, {})
        with pytest.raises(AssertionError, match=re.escape(reason)):
            check(Command("x.md:1", argv))
    from transduce.config import ConfigError

    for line, reason in (
        ("transduce train configs/multi30k_en_de.yaml train.max_steps=2000", "max_steps must exceed warmup_steps"),
        ("transduce train --preset tiny train.max_stpes=3", "did you mean 'train.max_steps'"),
        ("transduce prepare --config configs/toy.yaml data.vocab_sise=10", "did you mean 'data.vocab_size'"),
    ):
        (argv,) = commands_in(line, {})
        with pytest.raises(ConfigError, match=re.escape(reason)):
            check(Command("x.md:1", argv))


def test_shell_lines_give_their_transduce_commands():
    variables: dict[str, str] = {}
    assert commands_in('CS="data.tgt_lang=cs data.valid=$M/val"', variables) == []
    assert commands_in("M=../data", variables) == []
    assert variables == {"CS": "data.tgt_lang=cs data.valid=$M/val", "M": "../data"}
    line = "for r in a b; do transduce evaluate --model runs/$r --src $M/t.en 2>/dev/null; done  # both"
    assert commands_in(line, variables) == [("evaluate", "--model", "runs/$r", "--src", "../data/t.en")]
    assert commands_in("transduce train c.yaml $CS < /dev/null", variables) == [
        ("train", "c.yaml", "data.tgt_lang=cs", "data.valid=$M/val")
    ]
    line = "LD_PRELOAD=x.so torchrun --nproc_per_node 2 -m transduce.cli train c.yaml && transduce report r"
    assert commands_in(line, {}) == [("train", "c.yaml"), ("report", "r")]
    assert commands_in("git clone <this repository> transduce && cd transduce", {}) == []
    assert commands_in("transduce train: error: run.yaml: model.activation: 'rleu' ...", {}) == []
    assert commands_in("transduce export --format hf|ctranslate2 -o DIR", {}) == [
        ("export", "--format", "hf|ctranslate2", "-o", "DIR")
    ]
    assert code_lines("text\n```bash\na \\\n  b\nc\n```\nd\n") == [(3, "a b"), (5, "c")]


def test_the_cli_reference_lists_every_verb_and_every_download_dataset():
    from transduce.data.download import DATASETS

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = {m.group(1) for m in re.finditer(r"^\| `([a-z-]+)` \|", text, re.M)}
    assert set(COMMANDS) <= table, f"docs/cli.md's verb table lacks {sorted(set(COMMANDS) - table)}"
    synopses = [c.argv for c in COMMANDS_FOUND if c.where.startswith("docs/cli.md") and c.argv[0] == "download"]
    for dataset in DATASETS:
        assert any(dataset in argv or any(dataset in t.split("|") for t in argv) for argv in synopses), dataset
