"""Benchmarks of the streaming ASR engine: ``python -m pipecat_nemotron.bench <name> [options]``.

Benchmarks (one module each, results as JSON + PNG under ``--out``, default ``bench_out/``):

* ``buffered-vs-cache-aware``: compute per audio-second and WER against NeMo's buffered RNNT pipeline.
* ``concurrency``: real-time streams per machine, batched step cost, memory per stream.
* ``time-to-final``: finalize latency against utterance length, soft and hard finalize.
* ``soak``: many streams for minutes: lag and memory must not grow.
* ``load``: the WebSocket ASR server under N concurrent clients (its own module, ``bench.load``).

Importing this package does no work; each benchmark imports NeMo and torch when it runs.
"""
