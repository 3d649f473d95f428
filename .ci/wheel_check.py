"""Run by .ci/wheel with the virtual environment's Python, in an empty directory: checks that the installed wheel is
complete and works, with the C++ kernels built from its own files."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

FALLBACK = "could not build the CPU kernels"
venv = Path(os.environ["VENV"]).resolve()
bin_dir = venv / "bin"


def run(*argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    result = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], input=stdin, capture_output=True, text=True)
    if result.returncode != 0 or FALLBACK in result.stderr:
        sys.exit(f"{' '.join(argv)} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


import torch  # noqa: E402 (after the helpers: the checks read in order)

import transduce  # noqa: E402

assert torch.__version__.startswith("2.13.0"), f"the wheel's install changed torch to {torch.__version__}"
package = Path(transduce.__file__).resolve().parent
assert package.is_relative_to(venv), f"transduce was imported from {package}, not from the installed wheel"
csrc = Path(os.environ["REPO"]) / "src/transduce/model/csrc"
missing = [p.name for p in csrc.iterdir() if not (package / "model/csrc" / p.name).is_file()]
assert not missing, f"the wheel lacks model/csrc/{', '.join(missing)}"
assert (package / "serving/static/index.html").is_file(), "the wheel lacks serving/static/index.html"

with warnings.catch_warnings():
    warnings.simplefilter("error")  # the fallback warning fails the check
    from transduce.model import kernels

    assert kernels.compiled() is not None, "the kernels did not build from the installed files"

version = run("transduce", "--version").stdout.strip()
assert version == f"transduce {transduce.__version__}", version
run("transduce", "quickstart", "--out", "qs", "--minutes", "0.15", "--train-pairs", "3000", "--test-pairs", "20")
out = run("transduce", "translate", "--model", "qs/run", "--beam", "2", stdin="June 5, 2021\n\n").stdout
lines = out.split("\n")
# one line out per line in, the empty one empty (what the first says depends on how many updates 9 seconds of
# training bought on this machine: a model that has not learned to write yet writes nothing)
assert len(lines) == 3 and lines[1] == "" and lines[2] == "", repr(out)
print(f"wheel ok: {package}; kernels built; {version}; 'June 5, 2021' -> {lines[0]!r}")
