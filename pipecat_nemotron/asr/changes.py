"""When a stream's latency mode, language or phrase-boosting change takes effect.

The rule: a change applies to the first utterance of which no word has been emitted yet. The silence after a
final already belongs to the next utterance, so a change made between turns applies to the next thing the user
says, even though some of that silence has been decoded in the old setting:

- requested while the current utterance has no token yet (nothing decoded, or only silence), and no finalize
  is pending: it applies before the stream's next chunk (if a chunk of the stream is in the model step running
  now, as soon as that step is delivered, unless that chunk brings the utterance's first word);
- otherwise (a word of the utterance was emitted, or a finalize is pending): at the start of the utterance after
  the last finalize requested before the change.

So every word of an utterance is decoded in one mode, one language and with one boost list. What the decoded silence leaves behind:

- ``finalize_mode="soft"``: the stream keeps its encoder caches and decoder state (they are compatible across
  modes and languages, see ``docs/ARCHITECTURE.md``); the chunks after the change run in the new setting on
  the context built so far, exactly as after a final.
- ``finalize_mode="hard"`` (each utterance decodes as a clip of its own): the decode restarts at the first
  sample not yet decoded (zeroed caches, fresh decoder state, a new feature segment), so the utterance's final
  equals the offline decode, in the new mode and language, of its audio from that sample to its end.

Either way the utterance still starts at the previous final's boundary: ``start_ms``, ``utterance_audio_ms`` and word
times count from there (the cut only moves ``StreamState.segment_origin``, not ``utterance_origin``).
"""

from __future__ import annotations

from pipecat_nemotron.asr.boosting import BoostList
from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.words import TokenTrace


def request_change(
    state: StreamState,
    latency_ms: int | None = None,
    language: tuple[str | None, int | None] | None = None,
    boost: BoostList | None = None,
) -> None:
    """Record a requested mode, language or boost list (empty: none).

    The change is for the utterance after the finalizes requested so far.
    """
    if latency_ms is not None:
        state.pending_latency_ms = latency_ms
    if language is not None:
        state.pending_language = language
    if boost is not None:
        state.pending_boost = boost
    state.pending_utterance = state.utterance_index + len(state.finals)


def can_apply(state: StreamState) -> bool:
    """A change is pending and may apply now: no word of its utterance yet, no chunk in the running step."""
    return (
        (
            state.pending_latency_ms is not None
            or state.pending_language is not None
            or state.pending_boost is not None
        )
        and not state.in_flight
        and not state.closed
        and not state.tokens
        and state.utterance_index >= state.pending_utterance
    )


def apply_pending(state: StreamState, hop: int, hard_reset: bool) -> bool:
    """Apply the stream's pending change if :func:`can_apply`. Runs between steps (or off any step's stream).

    Args:
        state: The stream.
        hop: Samples per mel frame.
        hard_reset: The engine's ``finalize_mode`` is ``"hard"``: restart the decode at the first sample not
            decoded yet (see the module docstring).

    Returns:
        True if the decode restarted: the caller must zero the stream's cache slot before its next chunk.

    """
    if not can_apply(state):
        return False
    if state.pending_latency_ms is not None:
        state.latency_ms, state.pending_latency_ms = state.pending_latency_ms, None
    if state.pending_language is not None:
        (state.language, state.prompt_index), state.pending_language = state.pending_language, None
        state.evidence = None  # language detection reads only frames decoded under ``auto``
        state.detected_language = None
    if state.pending_boost is not None:
        boost, state.pending_boost = state.pending_boost, None
        state.boost = None if boost.empty else boost
    decoded = state.cursor.next_frame * hop
    if not hard_reset or not state.encoder_started or decoded == 0:
        return False
    state.cursor = state.cursor.split_at(decoded)
    state.segment_origin += decoded
    state.encoder_started = False
    state.dec_state = None
    state.trace = TokenTrace()
    return True
