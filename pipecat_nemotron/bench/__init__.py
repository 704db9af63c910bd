"""Benchmarks of the streaming ASR engine: ``python -m pipecat_nemotron.bench <name> [options]``.

Benchmarks (one module each, results as JSON + PNG under ``--out``, default ``bench_out/``):

* ``buffered-vs-cache-aware``: compute per audio-second and WER against NeMo's buffered RNNT pipeline.
* ``concurrency``: real-time streams per machine, batched step cost, memory per stream.
* ``time-to-final``: finalize latency against utterance length, soft and hard finalize.
* ``soak``: many streams for minutes: lag and memory must not grow.
* ``encoder-step``: our encoder step against NeMo's, per latency mode and batch size.
* ``load``: the WebSocket ASR server under N concurrent clients (its own module, ``bench.load``; the client in
  ``load_client``, the analysis in ``load_stats``, the local server in ``load_server``).

Shared pieces, one home each: ``common`` (machine and commit facts, options, models, engines, the entry point),
``audio`` (clips, looped audio, real-time pacing), ``stats`` (statistics, resource meters), ``wer`` (scoring) and
``output`` (result JSON, tables, figures). NeMo's buffered baseline is ``buffered_baseline``.

Importing this package does no work; each benchmark imports NeMo and torch when it runs.
"""
