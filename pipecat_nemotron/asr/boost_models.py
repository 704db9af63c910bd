"""The boosting trees of the streams' phrase lists, in the decoder's per-stream biasing multi-model.

Worker thread only: the model runner calls :meth:`BoostModels.prepare` while it builds a forward's previous
hypotheses, :meth:`BoostModels.release` with the slots it frees and :meth:`BoostModels.collect` at the end of
each step, all between decodes, so the multi-model never changes under a running decode.

NeMo 3.0's greedy label-looping RNNT decoder (``enable_per_stream_biasing``) keeps one
``GPUBiasingMultiModel`` of boosting trees and takes, per batch row, the id of the tree to add to that row's
joint scores (``-1``: none, the row decodes exactly as without biasing). A row's position in its tree lives in its
decoder state (``LabelLoopingStateItem.fusion_state_list``, last entry), which the engine keeps per stream.

We drive the multi-model ourselves rather than through NeMo's auto-managed requests
(``BiasingRequestItemConfig.auto_manage_multi_model``, which NeMo's pipeline adds at a stream's first frame and
removes at its last): the engine's streams change lists at utterance boundaries and share equal lists, so one
tree per distinct ``(phrases, alpha)`` is built once and counted by the streams that use it, and removed when the
last one leaves. NeMo's own content cache (``cache_key``) is process-global and never evicts; ours is per engine.

Building a tree (Python and numpy over the phrases' tokens: ~0.2 s for 1,000 phrases on an idle CPU core) can
start off the model thread: the engine calls :meth:`BoostModels.prebuild` on the event loop as soon as a list is
validated, and the step that first needs the tree takes it from there, waiting for the build only if it has not
finished. Only adding the built tree to the multi-model happens on the model thread.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from loguru import logger

from pipecat_nemotron.asr.boosting import NEMO_VERSION_FOR_BOOSTING, BoostList
from pipecat_nemotron.asr.errors import BoostingUnavailableError

#: Most trees built ahead (:meth:`BoostModels.prebuild`) and not yet added to the decoder.
MAX_PREBUILT = 16


def biasing_multi_model(model: Any) -> Any | None:
    """The decoder's per-stream biasing multi-model, or None if the decoder has none.

    None when the installed NeMo predates per-stream biasing (its decoding computer has no
    ``per_stream_biasing_enabled``) or when the engine did not ask for it (``max_boost_phrases=0``).
    """
    computer = getattr(getattr(model.decoding, "decoding", None), "decoding_computer", None)
    if computer is None or not getattr(computer, "per_stream_biasing_enabled", False):
        return None
    return computer.biasing_multi_model


def require_per_stream_biasing(model: Any) -> Any:
    """The decoder's multi-model; raise naming the NeMo version needed if there is none.

    Raises:
        BoostingUnavailableError: The installed NeMo has no per-stream biasing for greedy label-looping RNNT.

    """
    multi = biasing_multi_model(model)
    if multi is None:
        raise BoostingUnavailableError(biasing_unavailable_message())
    return multi


def biasing_unavailable_message() -> str:
    """The error of a NeMo without per-stream biasing, naming the version needed."""
    import nemo

    return (
        f"phrase boosting needs NeMo's per-stream biasing for greedy label-looping RNNT decoding "
        f"(nemo-toolkit>={NEMO_VERSION_FOR_BOOSTING}); the installed nemo-toolkit "
        f"{getattr(nemo, '__version__', '?')} has none: upgrade it, or configure no boost phrases"
    )


@dataclass
class _Tree:
    """One built boosting tree and the streams using it."""

    tree: Any
    model_id: int
    users: set[int] = field(default_factory=set)


class BoostModels:
    """Boosting trees by content, added to the decoder's multi-model while some stream uses them.

    Args:
        model: The loaded model (its decoder has per-stream biasing, see :func:`require_per_stream_biasing`).

    """

    def __init__(self, model: Any) -> None:
        self._model = model
        self._multi = require_per_stream_biasing(model)
        self._trees: dict[BoostList, _Tree] = {}
        #: The list each stream's decoder state is positioned in (its last ``prepare``).
        self._bound: dict[int, BoostList] = {}
        #: Trees built since the engine started (a test reads it: equal lists share one build).
        self.builds = 0
        #: Builds started off the model thread by :meth:`prebuild`, by list; taken by the step that adds the tree.
        self._building: dict[BoostList, Future[Any]] = {}
        self._lock = threading.Lock()
        self._builder: ThreadPoolExecutor | None = None

    @property
    def active(self) -> int:
        """Trees in the multi-model now."""
        return len(self._trees)

    def prepare(self, stream_id: int, boost: BoostList | None, dec_state: Any) -> tuple[Any, Any]:
        """Bind a stream to its list for the next decode.

        Builds and adds the list's tree if no other stream uses it, drops the stream's previous tree if it was the
        last user, and, when the stream's list changed, puts its decoder state at the new tree's start.

        Args:
            stream_id: The stream.
            boost: Its list now (None or empty: no boosting).
            dec_state: Its decoder state (None: start of sequence).

        Returns:
            ``(biasing_cfg, dec_state)``: NeMo's request for the stream's hypothesis (None: not boosted) and the
            decoder state to continue from.

        """
        self._follow_decoder()
        if boost is not None and boost.empty:
            boost = None
        previous = self._bound.get(stream_id)
        if boost != previous:
            self._unbind(stream_id)
            if boost is not None:
                entry = self._trees.get(boost) or self._add(boost)
                entry.users.add(stream_id)
                self._bound[stream_id] = boost
                dec_state = self._restart(dec_state)
        if boost is None:
            return None, dec_state
        from nemo.collections.asr.parts.context_biasing.biasing_multi_model import BiasingRequestItemConfig

        cfg = BiasingRequestItemConfig(
            boosting_model_alpha=boost.alpha,
            multi_model_id=self._trees[boost].model_id,
            auto_manage_multi_model=False,
        )
        return cfg, dec_state

    def prebuild(self, boost: BoostList) -> None:
        """Start building a list's tree on a builder thread (any thread may call it; a no-op if it is built).

        Builds not taken by a step are dropped, oldest first, beyond :data:`MAX_PREBUILT` (a list requested and
        then replaced before it applied).
        """
        if boost.empty or boost in self._trees:
            return
        with self._lock:
            if boost in self._building:
                return
            if self._builder is None:
                self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nemotron-boost-build")
            while len(self._building) >= MAX_PREBUILT:
                self._building.pop(next(iter(self._building)))
            self._building[boost] = self._builder.submit(self._build, boost)

    def close(self) -> None:
        """Stop the builder thread (pending builds are dropped)."""
        with self._lock:
            builder, self._builder = self._builder, None
            self._building.clear()
        if builder is not None:
            builder.shutdown(wait=False, cancel_futures=True)

    def release(self, stream_ids: list[int]) -> None:
        """Forget closed streams, and restarted ones.

        A restarted stream binds again, from a fresh decoder state, at its next forward. Trees stay until
        :meth:`collect`.
        """
        for sid in stream_ids:
            self._unbind(sid)

    def collect(self) -> None:
        """Remove the trees no stream uses (end of a step: a restarted stream that decoded again kept its tree)."""
        unused = [boost for boost, entry in self._trees.items() if not entry.users]
        for boost in unused:
            entry = self._trees.pop(boost)
            with torch.inference_mode(False):
                self._multi.remove_model(entry.model_id)

    def _unbind(self, stream_id: int) -> None:
        boost = self._bound.pop(stream_id, None)
        if boost is not None:
            self._trees[boost].users.discard(stream_id)

    def _build(self, boost: BoostList) -> Any:
        """The list's boosting tree (on the builder thread, or on the model thread if no build was started)."""
        from nemo.collections.asr.parts.context_biasing.boosting_graph_batched import (
            BoostingTreeModelConfig,
            GPUBoostingTreeModel,
        )

        from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

        with torch.inference_mode(False), quiet_nemo():
            tree = GPUBoostingTreeModel.from_config(
                BoostingTreeModelConfig(key_phrases_list=list(boost.phrases)), tokenizer=self._model.tokenizer
            )
        with self._lock:
            self.builds += 1
        return tree

    def _add(self, boost: BoostList) -> _Tree:
        with self._lock:
            started = self._building.get(boost)
        tree = started.result() if started is not None else self._build(boost)
        # Outside inference mode: the multi-model's buffers are edited in place when trees come and go.
        with torch.inference_mode(False):
            model_id = self._multi.add_model(model=tree, alpha=boost.alpha)
        entry = _Tree(tree, model_id)
        self._trees[boost] = entry
        with self._lock:  # only now: a list is always in _building or _trees, so prebuild never builds it twice
            self._building.pop(boost, None)
        logger.debug(f"Boosting tree of {len(boost.phrases)} phrases added ({tree.num_states} states)")
        return entry

    def _restart(self, dec_state: Any) -> Any:
        """The decoder state with its position in the biasing multi-model at a tree's start (None stays None)."""
        if dec_state is None or not getattr(dec_state, "fusion_state_list", None):
            return dec_state
        states = list(dec_state.fusion_state_list)
        start = self._multi.get_init_states(batch_size=1, bos=True)[0]
        states[-1] = start.to(device=states[-1].device, dtype=states[-1].dtype)
        return dataclasses.replace(dec_state, fusion_state_list=states)

    def _follow_decoder(self) -> None:
        """Re-add the trees if the decoder was rebuilt (the CUDA-graph decoder's fallback makes a new one).

        The streams' positions stay valid: they are positions inside their trees, which are the same.
        """
        multi = biasing_multi_model(self._model)
        if multi is None:
            raise BoostingUnavailableError("the RNNT decoder lost its per-stream biasing after a rebuild")
        if multi is self._multi:
            return
        self._multi = multi
        with torch.inference_mode(False):
            for boost, entry in self._trees.items():
                entry.model_id = multi.add_model(model=entry.tree, alpha=boost.alpha)
