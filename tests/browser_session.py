"""One browser session against the real bot, run inside a loopback-only network namespace by tests/test_browser.py.

    unshare -n sh -c 'ip link set lo up && exec python tests/browser_session.py --out DIR --wav MIC.wav ...'

Starts the loopback OpenAI-compatible LLM server (tests/openai_server.py), ``bots/bot.py -t webrtc`` with the
tiny ASR model and a tiny Magpie (without ``--magpie``: transcription only), and Debian's Chromium through
Playwright with a fake microphone playing ``--wav`` (looped by Chromium). Opens our offline page (``/nemotron``),
waits until the page shows every expected final transcript and, with the whole agent, the bot's audio and a
voice-to-voice figure per turn (transcription only: live interims), then writes ``DIR/result.json`` (the
page's state and what the LLM server received), ``DIR/page.png`` and ``DIR/bot.log``. Exit 0 when the page got
there within ``--timeout``, 1 otherwise (the result is written either way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openai_server import FakeOpenAIServer  # noqa: E402
from processes import clean_env, free_port, stop_process  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def start_bot(args: argparse.Namespace, llm_url: str, port: int, log: Path) -> subprocess.Popen:
    env = clean_env(NEMOTRON_ASR_MODEL=args.asr_model, NEMOTRON_ASR_DEVICE="cpu", NEMOTRON_WEBRTC_LOOPBACK="1")
    env.update(dict(kv.split("=", 1) for kv in args.bot_env))
    if args.embedded:  # nothing configured: the bot's embedded llama.cpp server and tiny Magpie
        pass
    elif args.magpie:  # the whole agent; without it the bot only transcribes
        env.update(NEMOTRON_LLM_BASE_URL=llm_url, NEMOTRON_LLM_API_KEY="none", MAGPIE_TTS_MODEL=args.magpie)
    else:
        env.update(NEMOTRON_LLM_EMBEDDED="0")
    out = log.open("w")
    return subprocess.Popen(
        [sys.executable, str(REPO / "bots" / "bot.py"), "-t", "webrtc", "--host", "127.0.0.1", "--port", str(port)],
        cwd=args.out,  # no .env there; the bot writes runs/ there
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


async def wait_for_log(bot: subprocess.Popen, log: Path, text: str, timeout: float) -> None:
    """Wait until the bot's log matches the regular expression ``text``."""
    deadline = time.monotonic() + timeout
    while not re.search(text, await asyncio.to_thread(log.read_text, errors="replace")):
        if bot.poll() is not None:
            raise RuntimeError(f"the bot exited with {bot.returncode} before {text!r}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {text!r} in the bot's log within {timeout:g} s")
        await asyncio.sleep(0.2)


# Done when the page shows every expected final and, with the whole agent, the bot's audio and a voice-to-voice
# figure for every turn up to the last expected final (a misheard final before it was a turn of its own);
# transcription only: the finals and live interims.
DONE = """([expected, agent]) => {
  const s = window.nemotron;
  if (!s) return false;
  const finals = s.finals.map((f) => f.text);
  if (!expected.every((t) => finals.includes(t))) return false;
  if (!agent) return s.interims > 0;
  const heard = Math.max(...expected.map((t) => finals.indexOf(t))) + 1;
  return s.turns.filter((t) => t.v2v_ms > 0).length >= Math.max(expected.length, heard) && s.botAudio.energy > 0;
}"""


async def run(args: argparse.Namespace) -> int:
    from playwright.async_api import async_playwright

    out = Path(args.out)
    result: dict = {"ok": False}
    port = free_port()
    started = time.monotonic()
    async with FakeOpenAIServer(reply="Four. Anything else?", first_token_delay_s=0.05) as llm:
        bot = start_bot(args, llm.base_url, port, out / "bot.log")
        try:
            await wait_for_log(bot, out / "bot.log", "Uvicorn running", timeout=240)
            result["bot_ready_s"] = round(time.monotonic() - started, 1)
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=CHROMIUM,
                    args=[
                        "--no-sandbox",
                        "--use-fake-ui-for-media-stream",
                        "--use-fake-device-for-media-stream",
                        f"--use-file-for-fake-audio-capture={args.wav}",
                        "--allow-loopback-in-peer-connection",
                        "--autoplay-policy=no-user-gesture-required",
                    ],
                )
                page = await browser.new_page(viewport={"width": 1100, "height": 760})
                console: list[str] = []
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
                await page.goto(f"http://127.0.0.1:{port}/nemotron?autoconnect=1&raw=1")
                connected_at = time.monotonic()
                try:
                    await page.wait_for_function(
                        DONE, arg=[args.expect, bool(args.magpie or args.embedded)], timeout=args.timeout * 1000, polling=250
                    )
                    result["ok"] = True
                except Exception as e:  # noqa: BLE001 - reported in the result; the screenshot shows the state
                    result["error"] = repr(e)
                result["page_s"] = round(time.monotonic() - connected_at, 1)
                await page.screenshot(path=str(out / "page.png"), full_page=True)
                state = await page.evaluate(
                    "() => JSON.parse(JSON.stringify(window.nemotron, (k, v) => typeof v === 'function' ? undefined : v))"
                )
                result.update(page=state, console=console[-50:])
                # The person leaves (the page's Disconnect closes the peer connection): the bot ends the session
                # at once, not at the idle timeout.
                await page.click("#disconnect")
                try:
                    await wait_for_log(bot, out / "bot.log", "the client left; ending the session", timeout=30)
                    await wait_for_log(bot, out / "bot.log", r"Session \S+ ended", timeout=30)
                    result["session_ended_when_client_left"] = True
                except (TimeoutError, RuntimeError) as e:
                    result["session_ended_when_client_left"] = repr(e)
                await browser.close()
        finally:
            stop_process(bot)
        result["llm_user_texts"] = [
            m.get("content")
            for r in llm.requests
            for m in r.get("messages", [])
            if m.get("role") == "user" and isinstance(m.get("content"), str)
        ]
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--wav", required=True, help="16-bit mono WAV the fake microphone plays (looped)")
    parser.add_argument("--asr-model", required=True)
    parser.add_argument(
        "--magpie", default=None, help="tiny Magpie .nemo (codec at its stored path); omit for transcription only"
    )
    parser.add_argument(
        "--embedded", action="store_true", help="no LLM or TTS configured: the bot's embedded agent answers"
    )
    parser.add_argument("--expect", nargs="+", required=True, help="final transcripts the page must show")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds the page gets, after it loads")
    parser.add_argument("--bot-env", nargs="*", default=[], help="KEY=VALUE settings for the bot (e.g. NEMOTRON_TURN_END=text)")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
