"""Which ASR model to use by default, and where the bundled tiny models and demo audio live."""

from __future__ import annotations

from pathlib import Path

from pipecat_nemotron.asr.config import DEFAULT_MODEL
from pipecat_nemotron.runtime.devices import resolve_device

ASSETS_DIR = Path(__file__).resolve().parent / "assets"

#: The tiny trained model of the Nemotron streaming family shipped with the package (CPU demo, tests).
TINY_MODEL_PATH = ASSETS_DIR / "tiny_nemotron_asr.nemo"

#: The tiny trained bilingual (en-US, es-ES) model of the multilingual prompt class (tests; see
#: ``docs/TINY_MULTILINGUAL_MODEL.md``).
TINY_MULTILINGUAL_MODEL_PATH = ASSETS_DIR / "tiny_nemotron_asr_multilingual.nemo"

#: The tiny model fine-tuned to emit ``<EOU>`` at the end of each utterance (``turn_end="eou"``; see
#: ``docs/TINY_MODEL.md``, *End of utterance*).
TINY_EOU_MODEL_PATH = ASSETS_DIR / "tiny_nemotron_asr_eou.nemo"

#: The bundled trained tiny Magpie and its codec (``scripts/make_tiny_magpie.py bundle``; ``docs/TINY_MAGPIE.md``):
#: the agent's TTS on a CPU. The Magpie names its codec by this file name, resolved beside it when loaded.
TINY_MAGPIE_PATH = ASSETS_DIR / "tiny_magpie.nemo"
TINY_MAGPIE_CODEC_PATH = ASSETS_DIR / "tiny_magpie_codec.nemo"

#: Bundled demo audio (held-out sentences of the tiny model) and its ``transcripts.json``.
DEMO_AUDIO_DIR = ASSETS_DIR / "demo"


def default_asr_model(device: str = "auto") -> str:
    """The real model on a CUDA machine, else the bundled tiny model (the 600M model is not real time on CPU).

    Args:
        device: The device the engine will use (``"auto"``, ``"cpu"``, ``"cuda"``...).

    """
    if resolve_device(device).startswith("cuda") or not TINY_MODEL_PATH.exists():
        return DEFAULT_MODEL
    return str(TINY_MODEL_PATH)
