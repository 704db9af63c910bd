"""Loading a cache-aware Nemotron Speech model through NeMo's own loaders, checking it can stream, building its runner.

NeMo is imported lazily here (it takes seconds and ~800 MB), never at ``import pipecat_nemotron`` time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_nemotron.asr.boosting import check_alphabet
from pipecat_nemotron.asr.config import EngineConfig, default_cpu_threads
from pipecat_nemotron.asr.errors import ModelLoadError
from pipecat_nemotron.asr.languages import resolve_prompt
from pipecat_nemotron.runtime.devices import resolve_device
from pipecat_nemotron.runtime.nemo_loading import NEMO_LOAD_LOCK as NEMO_LOAD_LOCK
from pipecat_nemotron.runtime.nemo_loading import prefetch_nemo_imports as prefetch_nemo_imports
from pipecat_nemotron.runtime.nemo_loading import wait_for_nemo_imports as wait_for_nemo_imports
from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

if TYPE_CHECKING:
    import torch

    from pipecat_nemotron.asr.runner import ModelRunner

#: Where a model id's ``.nemo`` file lives on the Hugging Face Hub: ``<repo>/<name>.nemo``.
_NEMO_SUFFIX = ".nemo"

#: What a failed download tells the user: the network it needs, and the local file that needs none.
_OFFLINE_HINT = (
    "Downloading needs network access to huggingface.co (or the model already in the Hugging Face cache, with "
    "HF_HUB_OFFLINE=1). Without network, pass the path of a local .nemo file instead: the bundled tiny model is "
    "pipecat_nemotron.TINY_MODEL_PATH (what pipecat_nemotron.default_asr_model('cpu') returns)."
)

def resolve_torch_device(device: str) -> torch.device:
    """Turn the config's ``"auto"``/``"cpu"``/``"cuda"``/``"cuda:N"`` into a :class:`torch.device` the engine can use.

    ``"auto"`` follows :func:`pipecat_nemotron.runtime.devices.resolve_device`, warning when it falls back to the CPU.

    Raises:
        ModelLoadError: A CUDA device was asked for and none is available.

    """
    import torch

    name = resolve_device(device)
    if device == "auto" and name == "cpu":
        logger.warning(
            "No CUDA GPU found: running the ASR model on the CPU. Expect only the tiny model or the 560/1120 ms "
            "modes to keep up with real time."
        )
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            f"device={device!r} was requested but torch.cuda.is_available() is False (torch {torch.__version__}). "
            "Install a CUDA build of torch or use device='cpu' / 'auto'."
        )
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Turn the config's dtype name into a :class:`torch.dtype` (``auto``: bf16 on CUDA, fp32 on CPU).

    ``int8`` computes in fp32 around int8 weights (:func:`quantize_feed_forward`).
    """
    import torch

    if dtype == "int8":
        return torch.float32
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _resolve_source(config: EngineConfig) -> tuple[str, Path | None]:
    """Return ``(description, local_path)``; ``local_path`` is None for a hub id without a pinned revision."""
    model = config.model
    if model.endswith(_NEMO_SUFFIX) or Path(model).expanduser().exists() or model.startswith((".", "/", "~")):
        path = Path(model).expanduser()
        if not path.exists():
            raise ModelLoadError(
                f"Model file {str(path)!r} does not exist. Pass the path of a .nemo checkpoint or a model id such "
                "as 'nvidia/nemotron-speech-streaming-en-0.6b'."
            )
        if path.is_dir():
            raise ModelLoadError(f"Model path {str(path)!r} is a directory; expected a .nemo file.")
        return str(path), path.resolve()
    if config.model_revision is None:
        return model, None
    from huggingface_hub import hf_hub_download

    filename = model.rsplit("/", 1)[-1] + _NEMO_SUFFIX
    try:
        local = hf_hub_download(repo_id=model, filename=filename, revision=config.model_revision)
    except Exception as e:
        raise ModelLoadError(
            f"Could not fetch {filename!r} of {model!r} at revision {config.model_revision!r}: {e}. "
            f"Check the id and revision. {_OFFLINE_HINT}"
        ) from e
    return f"{model}@{config.model_revision}", Path(local)


def load_asr_model(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """Load and validate a cache-aware RNNT model, in eval mode on ``device``.

    The encoder, decoder and joint are cast to ``dtype``; the mel preprocessor stays in fp32 (its STFT needs
    the range).

    Raises:
        ModelLoadError: The file is missing or corrupt, or the model cannot stream (names what was expected).

    """
    with NEMO_LOAD_LOCK:  # a relative path is resolved while no restore has changed the working directory
        description, local_path = _resolve_source(config)
    logger.info(f"Loading ASR model {description} on {device} ({str(dtype).replace('torch.', '')})")
    with NEMO_LOAD_LOCK, quiet_nemo():
        from nemo.collections.asr.models import ASRModel

        try:
            if local_path is not None:
                model = ASRModel.restore_from(str(local_path), map_location=device)
            else:
                model = ASRModel.from_pretrained(config.model, map_location=device)
        except Exception as e:
            if local_path is None:
                raise ModelLoadError(
                    f"Could not get the ASR model {description!r} from the Hugging Face Hub: {type(e).__name__}: "
                    f"{e}. Check the model id. {_OFFLINE_HINT}"
                ) from e
            raise ModelLoadError(
                f"Could not load ASR model from {description!r}: {type(e).__name__}: {e}. Expected a NeMo .nemo "
                "checkpoint of a cache-aware FastConformer-RNNT (e.g. nvidia/nemotron-speech-streaming-en-0.6b)."
            ) from e
    validate_cache_aware(model, description)
    _configure_decoding(model, confidence=config.word_timings, per_stream_biasing=config.max_boost_phrases > 0)
    model.eval()
    model.preprocessor.float()
    # ``prompt_kernel``: the language projection of a multilingual (prompt-class) model, fed the encoder output.
    for name in ("encoder", "decoder", "joint", "prompt_kernel"):
        if getattr(model, name, None) is not None:
            getattr(model, name).to(dtype=dtype)
    model.to(device)
    if config.dtype == "int8":
        quantize_feed_forward(model)
    return model


def quantize_feed_forward(model: Any) -> None:
    """Quantise the encoder's feed-forward Linear layers to int8 in place (torch dynamic quantisation, CPU).

    The two feed-forward modules of each layer hold two thirds of the encoder's weights, and both encoder
    steps call them as modules, so swapping their Linear layers for dynamically quantised ones (int8 weights,
    activations quantised per call) changes no other code. Attention and convolution weights stay fp32: the
    fast step reads them as tensors.
    """
    import warnings

    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice (torchao replaces it)
        for layer in model.encoder.layers:
            for ff in (layer.feed_forward1, layer.feed_forward2):
                quantize_dynamic(ff, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def validate_cache_aware(model: Any, description: str) -> None:
    """Check that ``model`` is a cache-aware streaming RNNT with a streamable preprocessor.

    Raises:
        ModelLoadError: Naming the file and what was expected.

    """
    from nemo.collections.asr.models import EncDecRNNTModel
    from nemo.collections.asr.parts.mixins.streaming import StreamingEncoder

    problems: list[str] = []
    if not isinstance(model, EncDecRNNTModel):
        problems.append(f"an RNNT (Transducer) model, got {type(model).__name__}")
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, StreamingEncoder):
        problems.append(f"a streaming (cache-aware) encoder, got {type(encoder).__name__}")
    elif getattr(encoder, "att_context_style", None) != "chunked_limited":
        problems.append(
            f"att_context_style='chunked_limited', got {getattr(encoder, 'att_context_style', None)!r}"
        )
    pre_cfg = model.cfg.get("preprocessor", {}) if hasattr(model, "cfg") else {}
    normalize = pre_cfg.get("normalize", "NA")
    if normalize not in (None, "NA", "None", False):
        problems.append(
            f"a preprocessor with normalize='NA' (per-utterance normalisation cannot stream), got {normalize!r}"
        )
    if problems:
        raise ModelLoadError(
            f"{description!r} is not a cache-aware streaming model: expected " + "; ".join(problems)
        )


#: NeMo's per-token confidence (``confidence_cfg`` of the RNNT decoding): computed by the label-looping decoder
#: from the joint's output distribution at the step that emitted each token; blank steps are left out (the
#: decoder then records nothing but the emitted tokens). See docs/TRANSCRIPTS.md for the choice of measure.
TOKEN_CONFIDENCE_CFG: dict[str, Any] = {
    "preserve_frame_confidence": True,
    "preserve_token_confidence": True,
    "preserve_word_confidence": False,  # words span engine steps: the engine aggregates them itself
    "exclude_blank": True,
    "aggregation": "min",
    "method_cfg": {"name": "entropy", "entropy_type": "tsallis", "alpha": 0.33, "entropy_norm": "exp"},
}


def _configure_decoding(model: Any, confidence: bool = True, per_stream_biasing: bool = False) -> None:
    """Select label-looping batched greedy RNNT decoding (with token confidence), the CUDA-graph decoder off.

    ``per_stream_biasing`` asks NeMo for the decoder's multi-model of phrase-boosting trees (rows without a
    tree decode exactly as without it); an older NeMo ignores the key, which
    :func:`~pipecat_nemotron.asr.boost_models.biasing_multi_model` detects.

    The CUDA-graph decoder is off because it has crashed with this model's streaming path; it can be enabled
    once tested on the target GPU. Token frames (``Hypothesis.timestamp``) come with every label-looping
    decode; ``compute_timestamps`` stays off (NeMo's word offsets would be per step, not per utterance).
    """
    from omegaconf import open_dict

    decoding_cfg = model.cfg.decoding
    with open_dict(decoding_cfg):
        decoding_cfg.strategy = "greedy_batch"
        decoding_cfg.greedy.loop_labels = True
        decoding_cfg.greedy.use_cuda_graph_decoder = False
        decoding_cfg.greedy.max_symbols = decoding_cfg.greedy.get("max_symbols", 10) or 10
        decoding_cfg.fused_batch_size = -1
        decoding_cfg.compute_timestamps = False
        if decoding_cfg.get("preserve_alignments"):
            # NeMo's EOU model class (``EncDecRNNTBPEEOUModel``) turns alignments on for its validation
            # metrics; the engine reads none, and every step's hypotheses would carry them.
            decoding_cfg.preserve_alignments = False
        decoding_cfg.confidence_cfg = TOKEN_CONFIDENCE_CFG if confidence else {}
        decoding_cfg.greedy.enable_per_stream_biasing = per_stream_biasing
    with quiet_nemo():
        model.change_decoding_strategy(decoding_cfg, verbose=False)


def check_loaded_defaults(config: EngineConfig, runner: Any) -> None:
    """Fail the load if the config's default mode, language, boost phrases or eou do not suit the loaded model.

    Raises:
        ModelLoadError: Naming what the model offers.

    """
    if config.default_latency_ms not in runner.modes:
        raise ModelLoadError(
            f"default_latency_ms={config.default_latency_ms} is not a mode of {config.model}; it offers "
            f"{sorted(runner.modes)} ms"
        )
    try:
        resolve_prompt(runner.prompts, config.default_language, config.model)
    except ValueError as e:
        raise ModelLoadError(f"default_language: {e}") from None
    if config.eou and runner.markers.eou is None:
        from pipecat_nemotron.asr.eou import eou_unavailable_message

        raise ModelLoadError(f"EngineConfig.eou: {eou_unavailable_message(config.model)}")
    if config.default_boost_phrases:
        if runner.boost is None:
            raise ModelLoadError(f"default_boost_phrases: {boosting_unavailable(config)}")
        try:
            check_alphabet(config.default_boost_phrases, runner.alphabet, Path(config.model).name)
        except ValueError as e:
            raise ModelLoadError(f"default_boost_phrases: {e}") from None


def boosting_unavailable(config: EngineConfig) -> str:
    """Why an engine without per-stream biasing cannot boost, naming the fix."""
    if config.max_boost_phrases == 0:
        return "phrase boosting is off (EngineConfig.max_boost_phrases=0); raise max_boost_phrases to use it"
    from pipecat_nemotron.asr.boost_models import biasing_unavailable_message

    return biasing_unavailable_message()


def load_runner(config: EngineConfig) -> tuple[ModelRunner, int]:
    """Load the model and build its runner: the engine's start, on the model's worker thread (the calling one).

    Returns:
        The runner, and torch's intra-op threads set on this thread on CPU (0 on CUDA).

    Raises:
        ModelLoadError: The model is missing, corrupt or cannot stream, or a config default does not suit it.

    """
    import torch

    wait_for_nemo_imports()
    from pipecat_nemotron.asr.runner import ModelRunner
    from pipecat_nemotron.asr.words import calibration_for

    device = resolve_torch_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    cpu_threads = 0
    if device.type == "cpu":
        # This is the model thread: torch keeps the count per thread (and hands it to threads made later).
        torch.set_num_threads(config.cpu_threads or default_cpu_threads())
        cpu_threads = torch.get_num_threads()
    model = load_asr_model(config, device, dtype)
    runner = ModelRunner(
        model,
        config.max_streams,
        device,
        dtype,
        config.encoder_step,
        max_batch=config.max_batch_size,
        cuda_graphs=config.cuda_graphs,
        cuda_graph_decoder=config.cuda_graph_decoder,
    )
    check_loaded_defaults(config, runner)
    runner.detect_language = runner.detect_language and config.detect_language
    runner.aligner.enabled = config.word_timings
    runner.aligner.calibration = calibration_for(config.model, config.word_timing_offsets_ms)
    return runner, cpu_threads
