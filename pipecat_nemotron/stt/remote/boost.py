"""The boosted phrases of a :class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService` session.

The server checks a phrase list against its limits (announced in ``ready.limits``) and its model's vocabulary.
:func:`boost_problem` checks what the client can know before sending (the feature, the limits), so most bad
updates become an ``ErrorFrame`` without changing the settings; :class:`BoostRequests` matches the server's answers
to the ``set_boost_phrases`` messages sent, so a list the server refuses (characters its model cannot write)
gives way to the last one it accepted.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from pipecat_nemotron.asr.boosting import validate_boost_phrases
from pipecat_nemotron.server.protocol import (
    BOOST_FEATURE,
    BoostMessage,
    ErrorMessage,
    ReadyMessage,
    SetBoostPhrasesMessage,
)

#: Why phrases are not boosted by an older server.
NO_BOOST_FEATURE = "the ASR server has no 'boost' feature (an older server)"


class BoostSetting(NamedTuple):
    """A phrase list and its weight (None: the server's default)."""

    phrases: tuple[str, ...]
    alpha: float | None


def boost_problem(ready: ReadyMessage | None, phrases: tuple[str, ...]) -> None:
    """Raise what the server would refuse in ``phrases`` (nothing while disconnected: the next ``config`` tells).

    Raises:
        ValueError: The server has no ``boost`` feature (an older server) and ``phrases`` is not empty, or more or
            longer phrases than its ``ready.limits`` allow (the engine's message, naming the limit).

    """
    if ready is None:
        return
    if BOOST_FEATURE not in ready.features:
        if phrases:
            raise ValueError(NO_BOOST_FEATURE)
        return
    limits = ready.limits
    validate_boost_phrases(
        phrases,
        max_phrases=int(limits.get("max_boost_phrases", len(phrases))),
        max_chars=int(limits.get("max_boost_phrase_chars", max((len(p) for p in phrases), default=1))),
    )


class BoostRequests:
    """The ``set_boost_phrases`` messages of one session still unanswered, and the last list the server accepted.

    The server answers each one, in order, with a ``boost`` acknowledgement or a non-fatal ``error`` whose
    ``request`` is ``"set_boost_phrases"``.
    """

    def __init__(self) -> None:
        self.accepted = BoostSetting((), None)
        self._sent: deque[BoostSetting] = deque()

    def opened(self, ready: ReadyMessage, setting: BoostSetting) -> str | None:
        """A session opened with ``setting`` in its ``config``; the error to report if the server ignored it.

        A server without the ``boost`` feature (an older one) ignores ``config.boost_phrases``: the phrases are
        not boosted, and the user must hear of it.
        """
        self._sent.clear()
        if BOOST_FEATURE not in ready.features:
            self.accepted = BoostSetting((), None)
            if setting.phrases:
                return f"{len(setting.phrases)} phrase(s) not boosted: {NO_BOOST_FEATURE}"
            return None
        self.accepted = setting
        return None

    def sending(self, msg: object) -> None:
        """``msg`` is being sent; a ``set_boost_phrases`` is owed an answer."""
        if isinstance(msg, SetBoostPhrasesMessage):
            self._sent.append(BoostSetting(msg.phrases, msg.alpha))

    def answered(self, msg: object) -> BoostSetting | None:
        """A server message arrived; if it refused the newest list sent, the setting to go back to."""
        refused = isinstance(msg, ErrorMessage) and msg.request == SetBoostPhrasesMessage.type
        if not self._sent or not (refused or isinstance(msg, BoostMessage)):
            return None
        setting = self._sent.popleft()
        if not refused:
            self.accepted = setting
            return None
        return self.accepted if not self._sent else None
