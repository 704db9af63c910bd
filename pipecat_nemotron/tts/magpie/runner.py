"""The model side of the Magpie scheduler: rows of the fast step, their codec decoders, one step at a time.

:class:`MagpieRunner` is what the worker (:mod:`~pipecat_nemotron.tts.magpie.scheduler`) executes a
:class:`~pipecat_nemotron.tts.magpie.policy.StepPlan` on. Its public step interface, keyed by request id:
:meth:`~MagpieRunner.open` (split the text into token chunks), :meth:`~MagpieRunner.prefill` (start rows, one batched
call), :meth:`~MagpieRunner.step` (one decoder step for every row), :meth:`~MagpieRunner.decode` (the pending audio of
many requests, one codec call), :meth:`~MagpieRunner.remove`. It holds no scheduling rule: which rows step, when a
request ends and when audio is due are the policy's.

Each request samples with its own ``torch.Generator``, so its audio does not depend on which requests share its
steps. Long text is split into chunks as NeMo's ``do_tts`` does; each chunk is decoded as its own sequence, one after
the other, in the request's row (NeMo's multi-chunk carry-over of text history and alignment is not kept); its
codec decoder runs on across chunks.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipecat_nemotron.tts.magpie.codec_stream import CodecDecoding
from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep, Row, RowSampling
from pipecat_nemotron.tts.magpie.options import uses_guidance
from pipecat_nemotron.tts.magpie.stream import Synthesis
from pipecat_nemotron.tts.magpie.streaming import StreamingDecoder, flush_together


def text_chunks(model: Any, text: str, language: str) -> list[torch.Tensor]:
    """``text`` as token chunks ``(T,)``, split as NeMo's ``do_tts`` splits it (sentences of long text).

    Args:
        model: A loaded ``MagpieTTSModel``.
        text: Text to speak.
        language: ISO 639-1 code.

    """
    from nemo.collections.tts.parts.utils.tts_dataset_utils import (
        chunk_text_for_inference,
        get_tokenizer_for_language,
    )

    tokenizer_name = get_tokenizer_for_language(language, list(model.tokenizer.tokenizers.keys()))
    chunks, chunk_lens, _ = chunk_text_for_inference(
        text=text,
        language=language,
        tokenizer_name=tokenizer_name,
        text_tokenizer=model.tokenizer,
        eos_token_id=model.eos_id,
    )
    return [tokens[: int(length)] for tokens, length in zip(chunks, chunk_lens, strict=True)]


class MagpieRunner:
    """The fast step's rows and the codec, keyed by request id. Not thread-safe: the engine's worker thread only.

    Args:
        model: A loaded ``MagpieTTSModel`` the fast step supports.
        codec: The engine's codec decoding.
        max_batch: Requests decoded together (each takes two cache slots with CFG).
        cuda_graphs: On a CUDA device, run the step's decoder and local transformer as CUDA graphs.

    """

    def __init__(self, model: Any, codec: CodecDecoding, *, max_batch: int, cuda_graphs: bool) -> None:
        self.model = model
        self.codec = codec
        self.sample_rate = int(model.output_sample_rate)
        self.samples_per_frame = int(model.codec_model_samples_per_frame)
        #: Decoder steps after which a row ends without end of speech (NeMo's ``max_decoder_steps``, read once: every
        #: row of this runner, and the policy, keep to it).
        self.max_row_steps = int(model.inference_parameters.max_decoder_steps)
        self._slots = 2 * max_batch
        self._graphs = cuda_graphs and next(model.decoder.parameters()).device.type == "cuda"
        self.step_model = self._new_step()
        self._texts: dict[int, list[torch.Tensor]] = {}
        self._speakers: dict[int, int] = {}
        self._sampling: dict[int, RowSampling] = {}
        self._decoders: dict[int, StreamingDecoder] = {}
        self._rows: dict[int, Row] = {}

    def _new_step(self) -> FastMagpieStep:
        if self._graphs:
            from pipecat_nemotron.tts.magpie.graphs import GraphedMagpieStep

            return GraphedMagpieStep(self.model, max_slots=self._slots)
        return FastMagpieStep(self.model, max_slots=self._slots)

    def describe_graphs(self) -> dict[str, Any]:
        """What the step captured as CUDA graphs (empty when it runs eagerly)."""
        describe = getattr(self.step_model, "describe", None)
        return describe() if describe is not None else {}

    # ---- the step interface --------------------------------------------------------------------------------

    def open(self, synthesis: Synthesis) -> int:
        """Split the request's text into token chunks; set up its generator and codec decoder.

        Returns:
            The number of text chunks (0: nothing to say).

        """
        chunks = text_chunks(self.model, synthesis.text, synthesis.language)
        options = synthesis.options
        seed = options.seed if options.seed is not None else secrets.randbits(63)
        generator = torch.Generator(device=self.step_model.device).manual_seed(seed)
        params = self.model.inference_parameters
        self._texts[synthesis.id] = chunks
        self._speakers[synthesis.id] = synthesis.speaker_index
        self._sampling[synthesis.id] = RowSampling(
            float(params.temperature), int(params.topk), uses_guidance(options, params.cfg_scale), generator
        )
        self._decoders[synthesis.id] = self.codec.new_decoder(options)
        return len(chunks)

    def prefill(self, starting: Sequence[Synthesis]) -> None:
        """Start each request's text chunk number ``text_chunk`` in a new row, all in one batched prefill.

        A request's previous row (its previous chunk) is freed first. If the prefill raises, none of the new rows
        exists and the other rows are untouched.
        """
        for synthesis in starting:
            self._drop_row(synthesis.id)
        joining = [
            (
                self._texts[s.id][s.text_chunk],
                self._speakers[s.id],
                self._sampling[s.id],
            )
            for s in starting
        ]
        with torch.inference_mode():
            rows = self.step_model.add_rows(joining)
        for synthesis, row in zip(starting, rows, strict=True):
            row.max_steps = self.max_row_steps  # The policy ends rows at this limit too.
            self._rows[synthesis.id] = row

    def step(self) -> set[int]:
        """One decoder step for every row; each keeps its new frame for its request's audio unless it ended.

        Returns:
            The ids of the requests whose row ended at end of speech this step (no frame kept).

        """
        with torch.inference_mode():
            self.step_model.advance(self.step_model.forward())
        ended = set()
        for request_id, row in self._rows.items():
            if row.ended:
                ended.add(request_id)
            else:
                self._decoders[request_id].append(row.codes[-1])
        return ended

    def decode(self, request_ids: Sequence[int]) -> list[np.ndarray | None]:
        """The int16 audio of each request's frames not yet decoded, in one codec call (None: no new frame)."""
        with torch.inference_mode():
            return flush_together(self.codec.decode_batch, [self._decoders[i] for i in request_ids])

    def remove(self, request_id: int) -> None:
        """Forget a request: free its row, drop its text, sampler and decoder. Idempotent."""
        self._drop_row(request_id)
        for table in (self._texts, self._speakers, self._sampling, self._decoders):
            table.pop(request_id, None)

    def reset(self) -> None:
        """Drop every row and start from a fresh step (after a failed step: its cache may be inconsistent)."""
        self._rows.clear()
        self.step_model = self._new_step()

    def _drop_row(self, request_id: int) -> None:
        row = self._rows.pop(request_id, None)
        if row is not None:
            with torch.inference_mode():
                self.step_model.remove_row(row)
