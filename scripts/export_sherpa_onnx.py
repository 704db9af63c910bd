#!/usr/bin/env python
"""Export a Nemotron-family ``.nemo`` model to sherpa-onnx's streaming NeMo transducer files, per latency mode.

Writes, for each ``--latency`` mode, ``OUT/<ms>/encoder.onnx decoder.onnx joiner.onnx tokens.txt`` (fp32) and
``encoder.int8.onnx decoder.int8.onnx joiner.int8.onnx`` (onnxruntime dynamic quantisation), plus
``export.json`` (the encoder metadata written). A multilingual (prompt) model is exported for one language
(``--language``, default ``auto``): sherpa-onnx's loader gives the encoder no language input. The format is described in
``pipecat_nemotron/bench/sherpa_export.py``. A model outside the family (not a cache-aware FastConformer RNNT
with an LSTM prediction network and a preprocessor sherpa-onnx reproduces) is refused with the reason.

Examples::

    .venv/bin/python scripts/export_sherpa_onnx.py pipecat_nemotron/assets/tiny_nemotron_asr.nemo \\
        --latency 160 560 --out bench_out/sherpa/tiny
    .venv/bin/python scripts/export_sherpa_onnx.py nemotron-speech-streaming-en-0.6b.nemo --latency 160 --no-int8

Then, with sherpa-onnx::

    recognizer = sherpa_onnx.OnlineRecognizer.from_transducer(tokens=..., encoder=..., decoder=..., joiner=...)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipecat_nemotron.asr.errors import ModelLoadError
from pipecat_nemotron.bench.sherpa_export import SherpaExportError, export_sherpa_onnx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help=".nemo checkpoint (or a model id the engine loads)")
    parser.add_argument(
        "--latency", type=int, nargs="+", default=[160], help="latency modes, ms (default: 160)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench_out/sherpa"), help="output folder")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 (dynamic quantisation) graphs")
    parser.add_argument(
        "--language",
        default=None,
        help="a multilingual (prompt) model's language baked into the encoder (default: auto)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    for ms in args.latency:
        try:
            files = export_sherpa_onnx(
                args.model, args.out / str(ms), ms, int8=not args.no_int8, language=args.language
            )
        except (SherpaExportError, ModelLoadError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{ms} ms -> {files.directory}: " + " ".join(sorted(p.name for p in files.directory.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
