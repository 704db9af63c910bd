"""What ``device="auto"`` means, for every engine and tool in the package: CUDA when a GPU is visible, else CPU."""

from __future__ import annotations


def resolve_device(device: str) -> str:
    """Resolve ``"auto"`` to ``"cuda"`` when a CUDA GPU is visible, else ``"cpu"``; other values pass through.

    Imports torch only for ``"auto"``. Checking that an explicit CUDA device exists is the loader's job (the ASR
    engine raises :class:`~pipecat_nemotron.asr.errors.ModelLoadError`).

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Returns:
        A torch device string.

    """
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
