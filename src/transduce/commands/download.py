"""Download a public dataset's raw files, e.g. `transduce download multi30k data/multi30k --langs en,de`.

Files land as `train.en.gz`, `val.de.gz`, `test_2016_flickr.en.gz`, ... ready for `transduce prepare` or the
recipes in configs/. Existing files are kept (use --force to fetch again). `transduce download ptb-sample DIR`
fetches NLTK's Penn Treebank sample (DIR/treebank.zip, unpacked into DIR/treebank/combined/) for parsing."""

from __future__ import annotations

import argparse

from transduce.commands.options import check_directory_output
from transduce.data.download import DATASETS, MULTI30K_URL, NLTK_DATA_URL, download
from transduce.files import Files

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(outputs=("directory",))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", choices=DATASETS)
    p.add_argument("directory", help="where the files go")
    p.add_argument("--langs", default="", help="comma-separated languages (default: all)")
    p.add_argument(
        "--base-url", help=f"where the raw files are served (default: {MULTI30K_URL}; ptb-sample: {NLTK_DATA_URL})"
    )
    p.add_argument("--force", action="store_true", help="fetch files that are already there again")


def run(args: argparse.Namespace) -> int:
    from transduce.files import directories_removed_on_failure

    check_directory_output(args.directory, "directory")
    langs = tuple(x.strip() for x in args.langs.split(",") if x.strip()) or None
    with directories_removed_on_failure(args.directory):  # a failed first fetch leaves no empty directory behind
        paths = download(args.dataset, args.directory, langs=langs, base_url=args.base_url, force=args.force)
    print(f"{len(paths)} files in {args.directory}")
    return 0
