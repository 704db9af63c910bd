"""Run exported models through sherpa-onnx's own streaming recognizer (``sherpa_onnx.OnlineRecognizer``).

How sherpa-onnx streams a NeMo cache-aware transducer (read from its C++ recognizer), which is where its
transcripts can differ from this engine's:

* **Steps.** Each step takes ``window_size`` mel frames starting at the frames already processed and then
  advances by ``chunk_shift``: step ``k`` reads frames ``[k * shift, k * shift + shift + pre_encode)``, the
  pre-encode frames at the *start* of the window. NeMo's (and this engine's) first step reads only the first
  chunk, and later steps put the previous chunk's last frames in front. So sherpa-onnx's first step is this
  engine's second, and the encoder frames of the first ``pre_encode`` mel frames (160 ms in the 160 ms mode)
  are dropped as pre-encode output: the attention cache starts two frames later.
* **End of stream.** A step needs a whole window; the last partial window is never decoded unless the caller
  appends silence before ``input_finished()`` (:func:`tail_padding`). This engine flushes the real remainder
  as one partial chunk instead.
* **Greedy search.** At most one token per encoder frame (NeMo's greedy allows ``max_symbols``, 10), and after
  a step that emitted tokens the next step feeds the last token to the LSTM once more from the state that has
  already consumed it.
* **Features.** kaldi-native-fbank (librosa-style mel, Hann window, no dither) instead of NeMo's
  preprocessor; the mel values differ slightly.

Nothing here imports sherpa-onnx at import time; :func:`sherpa_missing` says whether it is installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench.sherpa_export import SherpaModelFiles

#: Printed (and used as the skip reason) where the peer is not installed.
SHERPA_MISSING = (
    "sherpa-onnx is not installed: pip install 'pipecat-nemotron[bench]' (or pip install sherpa-onnx) "
    "to compare with it"
)
#: Mel frame hop, s.
FRAME_S = 0.01


def sherpa_missing() -> str | None:
    """None when sherpa-onnx imports, else :data:`SHERPA_MISSING`."""
    return None if importlib.util.find_spec("sherpa_onnx") is not None else SHERPA_MISSING


def read_metadata(files: SherpaModelFiles) -> dict[str, str]:
    """The encoder's metadata (what sherpa-onnx reads)."""
    import onnx

    model = onnx.load(str(files.graph("encoder")), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


def tail_padding(files: SherpaModelFiles) -> np.ndarray:
    """Silence that makes sherpa-onnx decode every real frame: one window plus one shift of zeros."""
    meta = read_metadata(files)
    frames = int(meta["window_size"]) + int(meta["chunk_shift"])
    return np.zeros(int(frames * FRAME_S * MODEL_SAMPLE_RATE), dtype=np.float32)


def make_recognizer(files: SherpaModelFiles, threads: int = 1) -> Any:
    """sherpa-onnx's streaming recognizer over an export (greedy search, no endpointing, CPU)."""
    import sherpa_onnx

    meta = read_metadata(files)
    return sherpa_onnx.OnlineRecognizer.from_transducer(
        tokens=str(files.tokens),
        encoder=str(files.graph("encoder")),
        decoder=str(files.graph("decoder")),
        joiner=str(files.graph("joiner")),
        num_threads=threads,
        sample_rate=MODEL_SAMPLE_RATE,
        feature_dim=int(meta["feat_dim"]),
        decoding_method="greedy_search",
        enable_endpoint_detection=False,
        provider="cpu",
    )


def decode_ready(recognizer: Any, streams: Sequence[Any]) -> int:
    """Decode every stream that has a whole window, batched with ``decode_streams``, until none has.

    Returns:
        The number of batched steps run.

    """
    steps = 0
    while True:
        ready = [s for s in streams if recognizer.is_ready(s)]
        if not ready:
            return steps
        recognizer.decode_streams(ready)
        steps += 1


def transcribe(recognizer: Any, files: SherpaModelFiles, clips: Sequence[np.ndarray]) -> list[str]:
    """Final text of each clip, all clips streamed together (batched steps), tail padding appended.

    Args:
        recognizer: From :func:`make_recognizer`.
        files: The export it runs (for the tail padding).
        clips: float32 mono audio at 16 kHz.

    """
    pad = tail_padding(files)
    streams = []
    for clip in clips:
        s = recognizer.create_stream()
        s.accept_waveform(MODEL_SAMPLE_RATE, np.asarray(clip, dtype=np.float32))
        s.accept_waveform(MODEL_SAMPLE_RATE, pad)
        s.input_finished()
        streams.append(s)
    decode_ready(recognizer, streams)
    return [recognizer.get_result(s).strip() for s in streams]
