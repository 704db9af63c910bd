"""Loading ``MagpieTTSModel`` checkpoints: from the Hugging Face hub by name, or from a local ``.nemo`` file.

Users and tests go through :func:`load_magpie_model`; nothing else in the package calls NeMo's restore API.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_nemotron.runtime.devices import resolve_device
from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

TTS_EXTRA_HINT = 'pip install "pipecat-nemotron[tts]"'
"""The install command named by errors about NeMo's TTS collection."""

_HUB_MODEL_MODULES = ("jieba", "pypinyin", "pypinyin_dict")  # The released checkpoint's Mandarin G2P.


def is_local_path(model: str) -> bool:
    """Whether ``model`` names a local checkpoint rather than a hub id.

    Args:
        model: A hub id such as ``"nvidia/magpie_tts_multilingual_357m"`` or a path to a ``.nemo`` file.

    Returns:
        True for anything ending in ``.nemo`` or starting like a filesystem path (``/``, ``.``, ``~``).

    """
    return model.endswith(".nemo") or model.startswith(("/", ".", "~"))


def check_tts_dependencies(model: str) -> None:
    """Fail fast, without importing NeMo, when modules the model needs are missing.

    NeMo's TTS collection ships inside ``nemo_toolkit`` whatever extras were installed, but its tokenizers import
    their dependencies lazily: the released multilingual checkpoint's Mandarin G2P needs ``jieba`` and ``pypinyin``
    (and fails with an unhelpful ``NameError`` without them). Hub checkpoints are checked for those here; local
    ones are checked when loaded.

    Args:
        model: Hub id or local ``.nemo`` path.

    Raises:
        ImportError: Naming the missing modules and the install command.

    """
    needed = ["nemo.collections.tts"]
    if not is_local_path(model):
        needed += list(_HUB_MODEL_MODULES)
    missing = [name for name in needed if not _module_available(name)]
    if missing:
        raise ImportError(
            f"Magpie TTS needs modules that are not installed ({', '.join(missing)}): {TTS_EXTRA_HINT}"
        )


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # A parent package is missing.
        return False


def check_model_source(model: str, codec_model_path: str | None) -> None:
    """Validate a model source cheaply (no NeMo import), so mistakes fail at construction.

    Args:
        model: Hub id or local ``.nemo`` path.
        codec_model_path: Optional local ``.nemo`` path (or hub id) of the audio codec, overriding the one stored
            in the Magpie checkpoint.

    Raises:
        FileNotFoundError: When a local path does not exist, naming the path.
        ValueError: When ``model`` is empty.

    """
    if not model:
        raise ValueError(
            'model must be a hub id such as "nvidia/magpie_tts_multilingual_357m" or a .nemo path'
        )
    if is_local_path(model) and not Path(model).expanduser().is_file():
        raise FileNotFoundError(
            f"Magpie checkpoint not found: {model!r}. Pass an existing .nemo file, or a hub id such as "
            f'"nvidia/magpie_tts_multilingual_357m".'
        )
    if (
        codec_model_path
        and is_local_path(codec_model_path)
        and not Path(codec_model_path).expanduser().is_file()
    ):
        raise FileNotFoundError(f"Codec checkpoint not found: codec_model_path={codec_model_path!r}.")


def load_magpie_model(model: str, device: str = "auto", codec_model_path: str | None = None) -> Any:
    """Load a ``MagpieTTSModel`` for inference.

    Hub ids go through ``MagpieTTSModel.from_pretrained`` (downloaded once into the Hugging Face cache); local
    ``.nemo`` files through ``MagpieTTSModel.restore_from``. The codec is not packed inside a Magpie ``.nemo``:
    NeMo restores it from the ``codecmodel_path`` stored in the checkpoint's config (a hub id, or the absolute path
    it had on the machine that saved it). ``codec_model_path`` overrides that value.

    Blocking (seconds to minutes): call it from a worker thread, never on the event loop.

    Args:
        model: Hub id (e.g. ``"nvidia/magpie_tts_multilingual_357m"``) or path to a ``.nemo`` file.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        codec_model_path: Optional codec ``.nemo`` path or hub id overriding the stored ``codecmodel_path``.

    Returns:
        The model, in eval mode, on ``device``.

    Raises:
        ImportError: When NeMo's TTS collection or one of the model's tokenizer dependencies is missing.
        FileNotFoundError: When a local checkpoint or the stored codec path does not exist.

    """
    import torch

    from pipecat_nemotron.runtime.nemo_loading import NEMO_LOAD_LOCK

    check_tts_dependencies(model)
    with NEMO_LOAD_LOCK:  # relative paths are checked while no restore has changed the working directory
        check_model_source(model, codec_model_path)
        local = is_local_path(model)
        if local:
            model = str(Path(model).expanduser().resolve())
        if codec_model_path is not None and is_local_path(codec_model_path):
            codec_model_path = str(Path(codec_model_path).expanduser().resolve())
    map_location = torch.device(resolve_device(device))
    with NEMO_LOAD_LOCK, quiet_nemo(logging.WARNING):
        try:
            from nemo.collections.tts.models import MagpieTTSModel
        except ImportError as e:
            raise ImportError(f"Importing NeMo's TTS collection failed ({e}): {TTS_EXTRA_HINT}") from e
        load = MagpieTTSModel.restore_from if local else MagpieTTSModel.from_pretrained
        net = _restore_magpie(model, load, local, codec_model_path, map_location)
    net.eval()
    folded = fold_weight_norm(getattr(getattr(net, "_codec_helper", None), "codec_model", None))
    logger.info(f"Loaded Magpie TTS {model!r} on {map_location} ({net.output_sample_rate} Hz)")
    logger.debug(f"Magpie codec: {folded} weight-norm parametrizations folded into plain weights")
    return net


def fold_weight_norm(module: Any) -> int:
    """Replace every parametrized weight of ``module`` (the codec's weight norms) by its value; return how many.

    Inference never changes the weights, so the value is the same; computed once here instead of at every codec
    call (each decode otherwise recomputes ~40 weight norms in Python, on the TTS worker that shares the GIL with
    the event loop). None: nothing to fold.
    """
    from torch.nn.utils import parametrize

    if module is None:
        return 0
    folded = 0
    for sub in list(module.modules()):
        if parametrize.is_parametrized(sub):
            for name in list(sub.parametrizations.keys()):
                parametrize.remove_parametrizations(sub, name, leave_parametrized=True)
                folded += 1
    return folded


def codec_beside(model: str, stored_codec: str) -> str | None:
    """The codec a local checkpoint names by a relative ``.nemo`` path, resolved against the checkpoint's folder.

    A checkpoint that travels with its codec (the bundled tiny Magpie names ``tiny_magpie_codec.nemo``) stores the
    codec's file name; NeMo itself would resolve it against the working directory. None: the stored value is a hub
    id or an absolute path, used as it is.

    Args:
        model: The checkpoint's absolute path.
        stored_codec: The checkpoint's ``codecmodel_path``.

    """
    if not stored_codec.endswith(".nemo") or Path(stored_codec).is_absolute():
        return None
    return str(Path(model).parent / stored_codec)


def save_with_codec_beside(
    magpie_path: str | Path, codec_path: str | Path, out_magpie: str | Path, codec_name: str
) -> tuple[Path, Path]:
    """Copy a local Magpie and its codec into one folder, the Magpie naming the codec by ``codec_name``.

    The pair then loads from wherever the folder goes (:func:`codec_beside`), as the bundled tiny Magpie does.
    Blocking (restores and saves the checkpoint).

    Args:
        magpie_path: The Magpie ``.nemo``.
        codec_path: Its codec ``.nemo`` (whatever path the Magpie stores).
        out_magpie: Where to write the Magpie ``.nemo``; the codec goes beside it as ``codec_name``.
        codec_name: The codec's file name, ending in ``.nemo``.

    Returns:
        ``(magpie, codec)``: the written paths.

    """
    import shutil

    from omegaconf import open_dict

    if "/" in codec_name or not codec_name.endswith(".nemo"):
        raise ValueError(f"codec_name must be a file name ending in .nemo, got {codec_name!r}")
    out = Path(out_magpie)
    out.parent.mkdir(parents=True, exist_ok=True)
    codec_out = out.parent / codec_name
    if Path(codec_path).resolve() != codec_out.resolve():
        shutil.copyfile(codec_path, codec_out)
    model = load_magpie_model(str(magpie_path), "cpu", codec_model_path=str(codec_out))
    with open_dict(model.cfg):
        model.cfg.codecmodel_path = codec_name
    with quiet_nemo(logging.WARNING):
        model.save_to(str(out))
    return out, codec_out


def _restore_magpie(
    model: str, load: Any, local: bool, codec_model_path: str | None, map_location: Any
) -> Any:
    """Restore a Magpie with ``load`` (``restore_from`` or ``from_pretrained``), its codec overridden if asked.

    ``model`` and ``codec_model_path`` are hub ids or absolute paths (the caller resolved local ones).

    Raises:
        ImportError: The checkpoint needs a Python module that is missing.
        FileNotFoundError: The codec the checkpoint refers to is missing.

    """
    override = None
    if local or codec_model_path:
        # Read the config first: to override the codec, and to name a missing codec before NeMo fails on it.
        cfg = load(model, return_config=True)
        if not codec_model_path and local:
            codec_model_path = codec_beside(model, str(cfg.codecmodel_path))
        if codec_model_path:
            cfg.codecmodel_path = codec_model_path
            override = cfg
        stored_codec = str(cfg.codecmodel_path)
        if not stored_codec.startswith("nvidia/") and not Path(stored_codec).is_file():
            raise FileNotFoundError(
                f"The codec this Magpie checkpoint refers to is missing: codecmodel_path={stored_codec!r}. "
                "Pass codec_model_path= pointing at the codec .nemo file."
            )
    try:
        return load(model, override_config_path=override, map_location=map_location)
    except Exception as e:
        missing = _missing_module(e)
        if missing is None:
            raise
        raise ImportError(
            f"Loading {model!r} needs the Python module {missing!r} (a NeMo TTS tokenizer dependency): "
            f"{TTS_EXTRA_HINT}"
        ) from e


def _missing_module(error: BaseException) -> str | None:
    """The module behind an import failure anywhere in ``error``'s chain (Hydra wraps instantiation errors)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError):
            return current.name or str(current)
        current = current.__cause__ or current.__context__
    return None
