"""Serve a trained model over HTTP: a JSON API with dynamic batching, and a page to try it and explore attention.

Examples:
  transduce serve --model runs/multi30k                       # http://127.0.0.1:8000/ ; Ctrl-C stops
  transduce serve --model runs/multi30k --host 0.0.0.0 --port 8080 --beam 5 --threads 2
  curl -s 127.0.0.1:8000/translate -H 'Content-Type: application/json' -d '{"sentences": ["A dog runs."]}'

Endpoints: POST /translate, POST /attention, GET /health, GET / (the page), GET /docs (the OpenAPI documentation).
A classifier (data.task: classify) answers POST /classify ({"texts": [...]} -> {"labels": [...], "probabilities":
[...]}) and GET /health instead (docs/transfer.md); the decoding options do not apply to it.
Requests arriving within --batch-wait-ms of each other (or while a batch is being translated) are translated
together. A request with more than --max-sentences sentences, a sentence of more than --max-chars characters or a
body of more than --max-body-bytes bytes is answered 413, and so is an /attention request of more than
--max-attention-tokens pieces on either side or --max-attention-values values; malformed JSON and wrong types 422.
The decoding options set the server's defaults (the run's decode config otherwise); each request may override beam,
length penalty, lengths and sampling. Needs the serve extra: pip install 'transduce[serve]'.
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket

from transduce.commands.options import non_negative_float, port_number, positive_int
from transduce.commands.translate import add_model_arguments, decode_config, load_translator
from transduce.errors import TransduceError
from transduce.files import Files

log = logging.getLogger(__name__)


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    g.add_argument("--port", type=port_number, default=8000, help="port, 0-65535 (default: 8000; 0: any free port)")
    g.add_argument(
        "--max-sentences", type=positive_int, default=64, metavar="N", help="sentences per request (default: 64)"
    )
    g.add_argument(
        "--max-chars", type=positive_int, default=1000, metavar="N", help="characters per sentence (default: 1000)"
    )
    g.add_argument("--max-body-bytes", type=positive_int, default=1_000_000, metavar="N", help="request body size")
    g.add_argument("--max-beam", type=positive_int, default=16, metavar="K", help="largest beam a request may ask for")
    g.add_argument(
        "--max-attention-tokens", type=positive_int, default=256, metavar="N",
        help="/attention: subword pieces of the source and of the target (default: 256)",
    )  # fmt: skip
    g.add_argument(
        "--max-attention-values", type=positive_int, default=1_000_000, metavar="N",
        help="/attention: values in an answer, layers x heads x target x source pieces (default: 1,000,000)",
    )  # fmt: skip
    g.add_argument(
        "--batch-wait-ms", type=non_negative_float, default=5.0, metavar="MS",
        help="batching window after a request (default: 5)",
    )  # fmt: skip
    g.add_argument("--max-batch-sentences", type=positive_int, default=256, metavar="N", help="sentences per batch")
    g.add_argument("--no-access-log", action="store_true", help="do not log every request")


def run(args: argparse.Namespace) -> int:
    try:
        from transduce.serving import server as serve
    except ImportError as e:
        raise TransduceError(
            f"serving needs FastAPI and uvicorn ({e.name} is missing): pip install 'transduce[serve]'"
        ) from e

    from transduce.transfer.classify import is_classifier

    check_address(args.host, args.port)  # before the model is loaded: a busy port should not cost the loading
    limits = {"max_sentences": args.max_sentences, "max_chars": args.max_chars, "max_body_bytes": args.max_body_bytes,
              "batch_wait_ms": args.batch_wait_ms, "max_batch_sentences": args.max_batch_sentences}  # fmt: skip
    if is_classifier(args.model[0]):
        models = {"classifier": load_classifier(args)}
    else:
        translator = load_translator(args, language_required=False)  # a request names its language
        translator.decode = decode_config(args, translator.decode)
        if translator.decode.tgt_lang:  # the requests' default (--tgt-lang) must be one of the model's languages
            translator.language_ids(translator.decode.tgt_lang, 1)
        models = {"translator": translator}
        limits.update(max_beam=args.max_beam, max_attention_tokens=args.max_attention_tokens,
                      max_attention_values=args.max_attention_values)  # fmt: skip
    try:
        serve.serve(" + ".join(args.model), args.host, args.port, access_log=not args.no_access_log, **models,
                    **limits)  # fmt: skip
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises it
        log.info("stopped")
    except ValueError as e:
        raise TransduceError(str(e)) from None
    except SystemExit as e:  # uvicorn exits when it cannot start (the port taken since check_address): one line
        if e.code in (0, None):
            raise
        shown = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
        raise TransduceError(f"cannot listen on {shown}: the server did not start (the log above says why)") from None
    return 0


def load_classifier(args: argparse.Namespace):
    """The classifier of --model, refusing the options that only a translation model reads."""
    import torch

    from transduce.commands.translate import _DECODE_OPTIONS
    from transduce.transfer.classify import Classifier

    model = args.model[0]
    if len(args.model) > 1:
        raise TransduceError(f"{model} is a classifier: serve one classifier, not an ensemble of {len(args.model)}")
    given = [f"--{o.replace('_', '-')}" for o in _DECODE_OPTIONS if getattr(args, o, None) is not None]
    given += [option for option, on in (("--int8", args.int8), ("--max-input-tokens", args.max_input_tokens)) if on]
    given += ["--precision"] if args.precision not in ("fp32", "auto") else []
    if given:
        raise TransduceError(f"{given[0]} applies to translation; {model} is a classifier")
    if args.threads:
        torch.set_num_threads(args.threads)
    return Classifier.load(model, args.device)


def check_address(host: str, port: int) -> None:
    """Fail in one line when the server could not listen on ``host:port``: an unknown host, a port in use or one
    that needs privileges. Binds a socket as uvicorn does (``SO_REUSEADDR``) and closes it at once.

    Raises:
        TransduceError: naming the address and the reason.
    """
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise TransduceError(f"--host {host}: not an address of this machine ({e})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                reason = "the port is in use (another server?); choose another with --port"
            else:
                reason = e.strerror or str(e)
            raise TransduceError(f"cannot listen on {shown}: {reason}") from None
