"""``embedded-llm``: time to first token and tokens per second of the embedded llama.cpp server, per GGUF.

Each GGUF runs in its own :class:`~pipecat_nemotron.llm.embedded.EmbeddedLLMServer` (the agent's way: a child
process on loopback, warmed up with the voice system prompt) and answers the same short spoken-style questions,
streamed through the OpenAI client with the agent's voice settings (system prompt, temperature, max tokens,
thinking off). Per question: time to first token (request sent → first text), tokens per second after it (text
chunks / s; llama.cpp's server streams one token per chunk) and the answer, for judging its quality by reading.

    python -m pipecat_nemotron.bench embedded-llm [--gguf A.gguf --gguf B.gguf] [--threads 1]

Without ``--gguf``: the bundled SmolLM2-135M-Instruct Q4_1.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipecat_nemotron.bench import common, output
from pipecat_nemotron.runtime.stats import percentile

NAME = "embedded-llm"

#: Short spoken-style questions (what a voice agent hears).
QUESTIONS = (
    "What is two plus two?",
    "What time is it, please?",
    "Can you recommend a good book?",
    "What's the weather like on Mars?",
    "Tell me a fun fact about cats.",
    "How do I boil an egg?",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--gguf", type=Path, action="append", default=None, help="GGUF file (repeatable)")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp CPU threads (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=common.DEFAULT_OUT, help="output folder (default: %(default)s)")


async def _one_model(gguf: Path | None, threads: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    from pipecat_nemotron.llm.embedded import DEFAULT_GGUF_FILE, EmbeddedLLMServer, EmbeddedLLMSettings
    from pipecat_nemotron.llm.service import VOICE_MAX_TOKENS, VOICE_SYSTEM_PROMPT, VOICE_TEMPERATURE

    async with EmbeddedLLMServer(EmbeddedLLMSettings(gguf=gguf, threads=threads)) as server:
        warm = time.perf_counter()
        await server.warm_up(VOICE_SYSTEM_PROMPT)
        warm_s = time.perf_counter() - warm
        client = AsyncOpenAI(base_url=server.base_url, api_key="none")
        answers = []
        for question in QUESTIONS:
            sent = time.perf_counter()
            first: float | None = None
            chunks: list[str] = []
            stream = await client.chat.completions.create(
                model=server.model,
                stream=True,
                max_tokens=VOICE_MAX_TOKENS,
                temperature=VOICE_TEMPERATURE,
                messages=[{"role": "system", "content": VOICE_SYSTEM_PROMPT}, {"role": "user", "content": question}],
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            async for chunk in stream:
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text:
                    first = first if first is not None else time.perf_counter()
                    chunks.append(text)
            done = time.perf_counter()
            ttft = (first - sent) * 1000.0 if first is not None else None
            rate = (len(chunks) - 1) / (done - first) if first is not None and done > first and len(chunks) > 1 else None
            answers.append({"question": question, "answer": "".join(chunks), "ttft_ms": ttft, "tokens_per_s": rate})
        return {
            "gguf": str(gguf) if gguf is not None else DEFAULT_GGUF_FILE,
            "start_s": server.started_s,
            "warm_up_s": warm_s,
            "answers": answers,
        }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every GGUF, one after another (never two servers at once: they would share the cores)."""
    result = output.result_header(NAME, args)
    models = [asyncio.run(_one_model(g, args.threads)) for g in (args.gguf or [None])]
    rows = []
    for model in models:
        ttfts = [a["ttft_ms"] for a in model["answers"] if a["ttft_ms"] is not None]
        rates = [a["tokens_per_s"] for a in model["answers"] if a["tokens_per_s"] is not None]
        model["ttft_p50_ms"] = percentile(ttfts, 50) if ttfts else None
        model["tokens_per_s_p50"] = percentile(rates, 50) if rates else None
        rows.append([Path(model["gguf"]).name, f"{model['start_s']:.1f}", f"{model['warm_up_s']:.2f}",
                     f"{model['ttft_p50_ms']:.0f}", f"{model['tokens_per_s_p50']:.0f}"])  # fmt: skip
    result["ggufs"] = models
    summary = output.format_table(["gguf", "start s", "warm-up s", "TTFT p50 ms", "tok/s p50"], rows)
    for model in models:
        summary += f"\n\n{Path(model['gguf']).name}:\n" + "\n".join(
            f"  {a['ttft_ms']:.0f} ms | {a['question']} -> {a['answer'].strip()!r}" for a in model["answers"]
        )
    output.finish(args.out, NAME, result, _figure(models), summary)
    return result


def _figure(models: list[dict[str, Any]]) -> Any:
    """Time to first token and tokens per second per question, one bar group per GGUF."""
    fig, axes = output.new_figure(1, 2, (11.0, 3.8))
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        x = [q + i * width for q in range(len(model["answers"]))]
        label = Path(model["gguf"]).name
        axes[0][0].bar(x, [a["ttft_ms"] or 0 for a in model["answers"]], width, label=label)
        axes[0][1].bar(x, [a["tokens_per_s"] or 0 for a in model["answers"]], width, label=label)
    for ax, title in ((axes[0][0], "time to first token, ms"), (axes[0][1], "tokens per second")):
        ax.set_title(title)
        ax.set_xlabel("question")
    axes[0][0].legend(fontsize=7)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    common.bench_main(NAME, __doc__, add_arguments, run, argv)
    return 0
