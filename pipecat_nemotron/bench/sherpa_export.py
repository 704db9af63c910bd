"""Export a Nemotron-family model to the files sherpa-onnx's streaming NeMo transducer loads.

sherpa-onnx (``OnlineRecognizer.from_transducer(..., model_type="")`` with three ONNX files) recognises a NeMo
cache-aware transducer by its encoder's metadata. What its C++ loader (``online-transducer-nemo-model.cc``,
``online-recognizer-transducer-nemo-impl.h``) reads, and therefore what this module writes:

* ``encoder.onnx``: inputs ``audio_signal`` ``[B, features, T]``, ``length`` ``[B]`` (int64), the caches
  batch-first (``cache_last_channel`` ``[B, layers, left, d_model]``, ``cache_last_time`` ``[B, layers, d_model,
  kernel-1]``, ``cache_last_channel_len`` ``[B]``); outputs the encoded frames ``[B, d_model, T']``, their
  lengths and the next caches. This is NeMo's own ``forward_for_export`` with ``cache_support``, one latency
  mode per export (the attention context is fixed in the graph). Metadata: ``vocab_size`` (without blank),
  ``window_size`` (mel frames per step: the chunk plus the pre-encode cache), ``chunk_shift`` (mel frames per
  step), ``subsampling_factor``, ``normalize_type``, ``pred_rnn_layers``, ``pred_hidden``, and the cache
  shapes ``cache_last_channel_dim1..3`` / ``cache_last_time_dim1..3``.
* ``decoder.onnx`` (the LSTM prediction network, ``targets`` int32 and two LSTM states) and ``joiner.onnx``:
  NeMo's own exports.
* ``tokens.txt``: ``piece id`` per line, blank (``<blk>``) last.
* ``*.int8.onnx``: onnxruntime's dynamic quantisation (uint8 weights) of the three graphs.

sherpa-onnx computes the mel features itself (kaldi-native-fbank, librosa-style mel, Hann window, no dither,
no per-utterance normalisation), so only models whose preprocessor it reproduces are exported:
:func:`check_family` refuses the others with the reason.

Nothing here imports NeMo, torch or onnx at import time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat_nemotron.asr._nemo_private import encoder_feat_in

#: Files of one export, per precision.
GRAPHS = ("encoder", "decoder", "joiner")
#: Larger graphs keep their weights in one ``<name>.data`` file beside them (protobuf's 2 GB limit).
EXTERNAL_DATA_BYTES = 1_500_000_000
#: The feature extractor sherpa-onnx runs for this model type: what the model's preprocessor must match.
SHERPA_PREPROCESSOR: dict[str, Any] = {
    "sample_rate": 16000,
    "window_size": 0.025,
    "window_stride": 0.01,
    "window": "hann",
    "n_fft": 512,
    "log": True,
    "frame_splicing": 1,
}


class SherpaExportError(ValueError):
    """The model cannot be exported to sherpa-onnx's streaming NeMo transducer format (the message says why)."""


@dataclass(frozen=True)
class SherpaModelFiles:
    """The files of one exported latency mode.

    Attributes:
        directory: Where they are.
        latency_ms: The latency mode baked into the encoder, ms.
        int8: True for the dynamically quantised graphs.

    """

    directory: Path
    latency_ms: int
    int8: bool = False

    def graph(self, name: str) -> Path:
        """Path of ``encoder``, ``decoder`` or ``joiner``, in this precision."""
        return self.directory / (f"{name}.int8.onnx" if self.int8 else f"{name}.onnx")

    @property
    def tokens(self) -> Path:
        """The token table."""
        return self.directory / "tokens.txt"

    def exists(self) -> bool:
        """True when every file of this precision is there."""
        return self.tokens.exists() and all(self.graph(g).exists() for g in GRAPHS)


def check_family(model: Any, description: str) -> None:
    """Refuse a model sherpa-onnx's streaming NeMo transducer cannot run the same way NeMo does.

    Args:
        model: A loaded NeMo ASR model.
        description: Its name, for the message.

    Raises:
        SherpaExportError: Naming everything that does not fit.

    """
    from nemo.collections.asr.models import EncDecRNNTModel
    from nemo.collections.asr.modules import ConformerEncoder, RNNTDecoder, RNNTJoint

    problems: list[str] = []
    if not isinstance(model, EncDecRNNTModel):
        problems.append(f"an RNNT (transducer) model, got {type(model).__name__}")
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, ConformerEncoder):
        problems.append(f"a (Fast)Conformer encoder, got {type(encoder).__name__}")
    elif getattr(encoder, "att_context_style", None) != "chunked_limited":
        problems.append(f"cache-aware attention ('chunked_limited'), got {encoder.att_context_style!r}")
    if not isinstance(getattr(model, "decoder", None), RNNTDecoder):
        problems.append(f"an LSTM prediction network (RNNTDecoder), got {type(model.decoder).__name__}")
    elif getattr(model.decoder, "blank_as_pad", True) is not True:
        problems.append("a prediction network whose blank is the padding symbol (blank_as_pad)")
    if not isinstance(getattr(model, "joint", None), RNNTJoint):
        problems.append(f"a plain RNNT joint, got {type(model.joint).__name__}")
    pre = model.cfg.get("preprocessor", {})
    for key, want in SHERPA_PREPROCESSOR.items():
        have = pre.get(key, want)
        if have != want:
            problems.append(f"preprocessor {key}={want!r} (sherpa-onnx computes that itself), got {have!r}")
    if pre.get("normalize", "NA") not in ("NA", None, "None", False):
        problems.append(f"preprocessor normalize='NA', got {pre.get('normalize')!r}")
    if problems:
        raise SherpaExportError(
            f"{description} is not a model of the Nemotron streaming family that sherpa-onnx's streaming NeMo "
            "transducer runs: expected " + "; ".join(problems)
        )


def encoder_metadata(model: Any, latency_ms: int) -> dict[str, str]:
    """The metadata sherpa-onnx reads from the encoder, for the mode currently set on ``model.encoder``."""
    encoder = model.encoder
    cfg = encoder.streaming_cfg
    chunk = int(cfg.chunk_size[1] if isinstance(cfg.chunk_size, list) else cfg.chunk_size)
    pre = cfg.pre_encode_cache_size
    pre_encode = int(pre[1] if isinstance(pre, list) else pre)
    normalize = model.cfg.preprocessor.get("normalize", "NA")
    meta: dict[str, Any] = {
        "vocab_size": model.decoder.vocab_size,
        "window_size": chunk + pre_encode,
        "chunk_shift": chunk,
        "chunk_size_ms": latency_ms,
        "normalize_type": "" if normalize in ("NA", None, "None", False) else normalize,
        "cache_last_channel_dim1": len(encoder.layers),
        "cache_last_channel_dim2": cfg.last_channel_cache_size,
        "cache_last_channel_dim3": encoder.d_model,
        "cache_last_time_dim1": len(encoder.layers),
        "cache_last_time_dim2": encoder.d_model,
        "cache_last_time_dim3": encoder.conv_context_size[0],
        "pred_rnn_layers": model.decoder.pred_rnn_layers,
        "pred_hidden": model.decoder.pred_hidden,
        "subsampling_factor": encoder.subsampling_factor,
        "feat_dim": encoder_feat_in(encoder),
        "model_type": "EncDecRNNTBPEModel",
        "model_author": "NeMo",
        "comment": f"exported by pipecat-nemotron, {latency_ms} ms mode",
        "version": "1",
    }
    return {k: str(v) for k, v in meta.items()}


def write_tokens(model: Any, path: Path) -> None:
    """``piece id`` per line, then ``<blk> vocab_size`` (sherpa-onnx wants the blank last)."""
    vocabulary = list(model.joint.vocabulary)
    if len(vocabulary) != model.decoder.vocab_size:
        raise SherpaExportError(
            f"the joint's vocabulary has {len(vocabulary)} tokens but the decoder {model.decoder.vocab_size}"
        )
    lines = [f"{piece} {i}" for i, piece in enumerate(vocabulary)] + [f"<blk> {len(vocabulary)}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _in_directory(path: Path) -> Iterator[None]:
    # torch's exporter writes a large model's tensors as loose files in the working directory.
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def _save(onnx_model: Any, path: Path, metadata: dict[str, str] | None, large: bool) -> None:
    import onnx

    if metadata is not None:
        del onnx_model.metadata_props[:]
        for key, value in metadata.items():
            onnx_model.metadata_props.add(key=key, value=value)
    data = path.with_suffix(".data")
    data.unlink(missing_ok=True)
    if large:
        onnx.save(onnx_model, str(path), save_as_external_data=True, location=data.name, size_threshold=1024)
    else:
        onnx.save(onnx_model, str(path))


@contextlib.contextmanager
def _prompt_baked_in(model: Any, prompt_index: int | None) -> Iterator[None]:
    """While exporting, the encoder's export forward also joins one language's one-hot (``prompt_kernel``).

    A multilingual (prompt-class) model conditions the encoder output on a language one-hot; sherpa-onnx's
    streaming NeMo loader feeds the encoder only audio and caches, so the export fixes one language. NeMo's
    exporter traces ``type(encoder).forward_for_export``: the encoder gets a subclass for the duration, and the
    projection a place among its submodules so that its weights are exported as weights.
    """
    if prompt_index is None:
        yield
        return
    import torch

    encoder, base = model.encoder, type(model.encoder)
    one_hot = torch.nn.functional.one_hot(torch.tensor([prompt_index]), int(model.num_prompts)).float()

    class PromptedEncoder(base):  # type: ignore[misc, valid-type]
        def forward_for_export(
            self,
            audio_signal,
            length,
            cache_last_channel=None,
            cache_last_time=None,
            cache_last_channel_len=None,
        ):  # noqa: ANN001, ANN202, D102
            out = base.forward_for_export(
                self, audio_signal, length, cache_last_channel, cache_last_time, cache_last_channel_len
            )
            frames = out[0].transpose(1, 2)  # [B, T, D]
            prompt = self.export_prompt_one_hot[:, None, :].expand(frames.size(0), frames.size(1), -1)
            joined = self.export_prompt_kernel(torch.cat((frames, prompt), dim=-1)).transpose(1, 2)
            return (joined, *out[1:])

    encoder.add_module("export_prompt_kernel", model.prompt_kernel)
    encoder.register_buffer("export_prompt_one_hot", one_hot, persistent=False)
    encoder.__class__ = PromptedEncoder
    try:
        yield
    finally:
        encoder.__class__ = base
        del encoder.export_prompt_kernel
        del encoder.export_prompt_one_hot


def _export_graphs(
    model: Any, out_dir: Path, metadata: dict[str, str], prompt_index: int | None = None
) -> None:
    """NeMo's exports of encoder (with caches), decoder and joint, re-saved with metadata into ``out_dir``."""
    import onnx
    import torch

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    large = sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES
    model.set_export_config({"cache_support": True})
    modules = {"encoder": model.encoder, "decoder": model.decoder, "joiner": model.joint}
    with (
        tempfile.TemporaryDirectory(dir=out_dir) as tmp,
        _in_directory(Path(tmp)),
        torch.no_grad(),
        _prompt_baked_in(model, prompt_index),
    ):
        for name, module in modules.items():
            raw = Path(tmp) / f"{name}.onnx"
            with quiet_nemo():
                module.export(str(raw), check_trace=False)
            _save(onnx.load(str(raw)), out_dir / raw.name, metadata if name == "encoder" else None, large)


def _prompt_index(model: Any, language: str | None) -> int | None:
    """The one-hot index of ``language`` on a prompt-class model (None for a model without prompts)."""
    from pipecat_nemotron.asr.languages import AUTO, LanguagePrompts

    prompts = LanguagePrompts.from_model(model)
    if prompts is None:
        return None
    try:
        key = prompts.resolve(language or AUTO)
    except ValueError as e:
        raise SherpaExportError(f"language {language!r}: {e}") from e
    return prompts.dictionary[key]


def quantize_int8(out_dir: Path) -> None:
    """``<graph>.int8.onnx`` beside each fp32 graph: onnxruntime's dynamic quantisation, uint8 weights."""
    import io
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantiser prints tensor protos and logs a warning per skipped node: keep the output readable.
    previous = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    try:
        for name in GRAPHS:
            with contextlib.redirect_stdout(io.StringIO()):
                quantize_dynamic(
                    model_input=out_dir / f"{name}.onnx",
                    model_output=out_dir / f"{name}.int8.onnx",
                    weight_type=QuantType.QUInt8,
                )
    finally:
        logging.getLogger().setLevel(previous)


def export_sherpa_onnx(
    model_path: str | Path,
    out_dir: str | Path,
    latency_ms: int,
    int8: bool = True,
    language: str | None = None,
) -> SherpaModelFiles:
    """Export one latency mode of a ``.nemo`` model to sherpa-onnx's streaming NeMo transducer files.

    Args:
        model_path: A ``.nemo`` checkpoint the engine loads (or a model id the engine resolves).
        out_dir: Folder for ``encoder/decoder/joiner[.int8].onnx`` and ``tokens.txt`` (created).
        latency_ms: The latency mode (the model's own modes, e.g. 80/160/560/1120 ms).
        int8: Also write the dynamically quantised graphs.
        language: For a multilingual (prompt-class) model, the language baked into the encoder (a locale of its
            prompt dictionary, a bare language or ``auto``; default ``auto``). Ignored for the English model.

    Returns:
        The fp32 files (``dataclasses.replace(files, int8=True)`` names the int8 ones).

    Raises:
        SherpaExportError: The model is outside the family, or has no such mode.
        pipecat_nemotron.asr.ModelLoadError: The model does not load as a cache-aware streaming RNNT.

    """
    import torch

    from pipecat_nemotron.asr import EngineConfig
    from pipecat_nemotron.asr.loading import load_asr_model
    from pipecat_nemotron.asr.modes import model_latency_modes

    out = Path(out_dir).resolve()  # the exporter runs in a scratch working directory
    out.mkdir(parents=True, exist_ok=True)
    model = load_asr_model(
        EngineConfig(model=str(model_path), device="cpu", dtype="float32", word_timings=False),
        torch.device("cpu"),
        torch.float32,
    )
    check_family(model, str(model_path))
    modes = model_latency_modes(model.encoder)
    if latency_ms not in modes:
        raise SherpaExportError(f"{model_path} has no {latency_ms} ms mode; its modes are {sorted(modes)} ms")
    model.encoder.set_default_att_context_size(list(modes[latency_ms]))
    metadata = encoder_metadata(model, latency_ms)
    prompt_index = _prompt_index(model, language)
    if prompt_index is not None:
        metadata["comment"] += f", language {language or 'auto'} (prompt {prompt_index}) baked in"
    _export_graphs(model, out, metadata, prompt_index)
    write_tokens(model, out / "tokens.txt")
    del model  # the 600M model is 2.5 GB: free it before the quantiser loads the graphs
    gc.collect()
    if int8:
        quantize_int8(out)
    (out / "export.json").write_text(
        json.dumps({"model": str(model_path), "latency_ms": latency_ms, "metadata": metadata}, indent=2)
    )
    return SherpaModelFiles(out, latency_ms)
