"""A real browser over WebRTC: Debian's Chromium, our offline page, the real bot; loopback-only network namespace.

The page (``/nemotron``, served by ``bots/bot.py``) is what a demo builder opens; Chromium's fake microphone plays
two bundled demo utterances. Each test runs ``tests/browser_session.py`` under ``unshare -n`` so that no packet
leaves 127.0.0.1, then checks what the page showed and what the LLM server received. The screenshot is kept in
the test's output folder (printed on failure).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from pipecat_nemotron.models import DEMO_AUDIO_DIR
from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL

pytestmark = pytest.mark.browser

DRIVER = Path(__file__).resolve().parent / "browser_session.py"
CHROMIUM = Path("/usr/bin/chromium")
TURNS = ("demo_math.wav", "demo_timer.wav")


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return "Debian's chromium is not installed (apt-get install chromium; `make test` does it as root)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip are missing (apt-get install util-linux iproute2)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace (unshare -n: {probe.stderr.strip()}); run as root"
    return None


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two turns for the fake microphone: 2 s of silence, then each utterance followed by 4 s of silence.

    4 s between turns: longer than Smart Turn's 3 s fallback, so each utterance is its own turn even where the
    turn analyzer finds the sentence incomplete.
    """
    reason = _missing()
    if reason is not None:
        pytest.skip(f"BROWSER TESTS SKIPPED: {reason}")
    silence = lambda s: np.zeros(int(16000 * s), dtype="<i2").tobytes()  # noqa: E731
    pcm = silence(2.0)
    for name in TURNS:
        with wave.open(str(DEMO_AUDIO_DIR / name), "rb") as w:
            pcm += w.readframes(w.getnframes()) + silence(4.0)
    path = tmp_path_factory.mktemp("mic") / "two_turns.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)  # 16-bit: Chromium plays 24-bit files as silence
        w.setframerate(16000)
        w.writeframes(pcm)
    return path


@pytest.fixture(scope="module")
def spoken() -> list[str]:
    texts = json.loads((DEMO_AUDIO_DIR / "transcripts.json").read_text())
    return [texts[name] for name in TURNS]


def _run_session(
    out: Path,
    mic_wav: Path,
    spoken: list[str],
    magpie: Path | None,
    bot_env: tuple[str, ...] = (),
    embedded: bool = False,
) -> dict:
    cmd = [
        sys.executable, str(DRIVER), "--out", str(out), "--wav", str(mic_wav),
        "--asr-model", str(TRAINED_MODEL), "--expect", *spoken,
    ]  # fmt: skip
    if magpie is not None:
        cmd += ["--magpie", str(magpie)]
    if bot_env:
        cmd += ["--bot-env", *bot_env]
    if embedded:
        cmd += ["--embedded"]
    run = subprocess.run(
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *cmd],
        capture_output=True,
        text=True,
        timeout=420,
    )
    result_path = out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    log = (out / "bot.log").read_text(errors="replace")[-4000:] if (out / "bot.log").exists() else ""
    assert run.returncode == 0 and result.get("ok"), (
        f"browser session failed (rc {run.returncode}); screenshot {out / 'page.png'}\n"
        f"{json.dumps({k: v for k, v in result.items() if k != 'page'}, indent=1)[:3000]}\n"
        f"page: {json.dumps(result.get('page'))[:2000]}\ndriver stderr: {run.stderr[-3000:]}\nbot log: {log}"
    )
    assert (out / "page.png").stat().st_size > 10_000
    assert result["session_ended_when_client_left"] is True, result["session_ended_when_client_left"]
    # A person running the bot sees what it heard: one INFO line per final, with the session and TTFS.
    for text in spoken:
        assert f"heard: {text!r} (TTFS " in (out / "bot.log").read_text(errors="replace")
    return result


def test_browser_talks_to_the_whole_agent(
    tmp_path: Path, mic_wav: Path, spoken: list[str], bot_magpie: Path
) -> None:
    result = _run_session(tmp_path / "session", mic_wav, spoken, bot_magpie)
    page = result["page"]
    finals = [f["text"] for f in page["finals"]]
    assert all(text in finals for text in spoken), finals
    # Each final shows its own TTFS and ASR finalize time.
    for final in page["finals"]:
        assert final["ttfs_ms"] > 0 and final["finalize_ms"] > 0, final
    # The LLM got what the page showed, turn by turn.
    for text in spoken:
        assert text in result["llm_user_texts"], result["llm_user_texts"]
    # The page played the bot's audio and shows a voice-to-voice figure for every turn.
    assert page["botAudio"]["energy"] > 0 and page["botAudio"]["bytes"] > 0
    turns = [t for t in page["turns"] if t["v2v_ms"] > 0]
    assert len(turns) >= len(spoken), page["turns"]
    for t in turns:
        assert t["ttfs_ms"] > 0 and t["llm_ttfb_ms"] > 0 and t["tts_ttfb_ms"] > 0, t
    assert page["botReady"] and page["errors"] == []


def test_a_newcomer_speaks_to_the_embedded_agent_in_the_browser(tmp_path: Path, mic_wav: Path, spoken: list[str]) -> None:
    """`python bots/bot.py -t webrtc` with no .env: the bot's own llama.cpp server answers and the tiny Magpie speaks;
    the page shows every turn's voice-to-voice and plays the answers."""
    result = _run_session(tmp_path / "session", mic_wav, spoken, None, embedded=True)
    page = result["page"]
    assert result["llm_user_texts"] == []  # the loopback fake was not asked: the embedded server answered
    assert page["botAudio"]["energy"] > 0 and page["botAudio"]["bytes"] > 0
    turns = [t for t in page["turns"] if t["v2v_ms"] > 0]
    assert turns and all(t["llm_ttfb_ms"] > 0 and t["tts_ttfb_ms"] > 0 for t in turns), page["turns"]
    assert page["botReady"] and page["errors"] == []
    assert "Embedded LLM: ready" in (tmp_path / "session" / "bot.log").read_text(errors="replace")


def test_browser_sees_live_transcripts_from_a_transcription_only_bot(
    tmp_path: Path, mic_wav: Path, spoken: list[str]
) -> None:
    result = _run_session(tmp_path / "session", mic_wav, spoken, magpie=None)
    page = result["page"]
    assert page["botReady"] and page["interims"] > 0
    assert all(text in [f["text"] for f in page["finals"]] for text in spoken)
    assert result["llm_user_texts"] == [] and page["turns"] == []


#: A question Smart Turn v3 alone calls incomplete (probability of complete 0.008 offline, in this voice at 150
#: words per minute): it holds the turn for its 3 s fallback silence. The words are a complete question.
HELD_QUESTION = ("what is nine plus four", "en-gb-x-rp+Alicia", "150")
#: What the tiny model writes for it, as the Nemotron models would.
HELD_QUESTION_FINAL = "What is nine plus four?"


async def _smart_turn_verdict(path: Path) -> bool:
    """Smart Turn v3's verdict on the WAV's speech followed by the VAD's 200 ms stop (True: complete)."""
    from pipecat.audio.turn.base_turn_analyzer import EndOfTurnState

    from pipecat_nemotron.agent.turn_end import smart_turn_analyzer

    with wave.open(str(path)) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    loud = np.flatnonzero(np.abs(samples) > 100)
    speech = samples[loud[0] : loud[-1] + 1]
    analyzer = smart_turn_analyzer()
    analyzer.set_sample_rate(16000)
    try:
        for i in range(0, speech.size, 320):  # 20 ms frames, as the transport sends them
            analyzer.append_audio(speech[i : i + 320].tobytes(), True)
        for _ in range(10):
            analyzer.append_audio(np.zeros(320, "<i2").tobytes(), False)
        state, _ = await analyzer.analyze_end_of_turn()
    finally:
        await analyzer.cleanup()
    return state == EndOfTurnState.COMPLETE


@pytest.fixture(scope="module")
def held_question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The question by espeak-ng (16 kHz, 16-bit), between 2 s of silence and 5 s (more than Smart Turn's 3 s)."""
    reason = _missing()
    if reason is not None:
        pytest.skip(f"BROWSER TESTS SKIPPED: {reason}")
    text, voice, speed = HELD_QUESTION
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", speed, "--stdout", text], capture_output=True, check=True
    ).stdout
    raw = subprocess.run(
        ["sox", "-D", "-t", "wav", "-", "-r", "16000", "-c", "1", "-b", "16", "-e", "signed", "-t", "raw", "-"],
        input=wav,
        capture_output=True,
        check=True,
    ).stdout
    path = tmp_path_factory.mktemp("mic") / "held_question.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.zeros(32000, "<i2").tobytes() + raw + np.zeros(80000, "<i2").tobytes())
    return path


def test_browser_question_smart_turn_holds_is_committed_by_its_words(
    tmp_path: Path, held_question_wav: Path, bot_magpie: Path
) -> None:
    """With ``NEMOTRON_TURN_END=text`` the transcript rule commits the question at the VAD stop, not Smart Turn's
    fallback: the turn record says so. Its voice-to-voice is recorded (``turn_end.json``), not asserted."""
    # The premise: Smart Turn alone holds this question (offline, on the same audio).
    assert asyncio.run(_smart_turn_verdict(held_question_wav)) is False
    text = HELD_QUESTION_FINAL
    result = _run_session(
        tmp_path / "session", held_question_wav, [text], bot_magpie, bot_env=("NEMOTRON_TURN_END=text",)
    )
    turns = [t for t in result["page"]["turns"] if t["v2v_ms"] > 0]
    # The turn whose final is the question (the tiny model can mishear the first pass of the looping microphone,
    # "hey nine plus four": that turn's words are no question, and Smart Turn's fallback rightly ended it).
    finals = [f["text"] for f in result["page"]["finals"]]
    assert len(turns) > finals.index(text), (finals, result["page"]["turns"])
    first = turns[finals.index(text)]
    (tmp_path / "turn_end.json").write_text(json.dumps(first, indent=1))
    print(f"held question committed by its words: v2v {first['v2v_ms']:.0f} ms, turn end {first.get('turn_end')}")
    assert first.get("turn_end", {}).get("by") == "text", first
    assert first["turn_end"]["verdict"] == "complete" and first["turn_end"]["commit"] is True
    # Smart Turn's verdict at the same VAD stop: "incomplete", or none when the words committed the turn before its
    # inference was done (the complete sentence does not wait for it).
    assert first["turn_end"]["smart_complete"] in (False, None), first
    assert text in result["llm_user_texts"], result["llm_user_texts"]
