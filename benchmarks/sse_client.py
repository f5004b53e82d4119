"""Benchmark the client side of streaming: CPU per streamed chunk, by how the reply is read.

    python benchmarks/sse_client.py [--streams 200] [--tps 50] [--tokens 150]

Runs `--streams` paced streams from the fake endpoint (tests/fake_openai.py, a
separate process) through the real `openai` SDK, four ways: the SDK's chunk
objects or the raw SSE lines (`with_streaming_response` + `json.loads`), each
over the SDK's default httpx2 transport and over its aiohttp one. Prints the
CPU of this process per chunk for each (one JSON line on stdout). This is the
measurement behind `backend/models/client.py` reading raw lines over aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai

from tests.fake_openai import FakeOpenAIProcess, Scenario

BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "bench"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def sdk_chunks(client: openai.AsyncOpenAI) -> int:
    count = 0
    stream = await client.chat.completions.create(**BODY)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            count += 1
    return count


async def raw_lines(client: openai.AsyncOpenAI) -> int:
    count = 0
    async with client.chat.completions.with_streaming_response.create(**BODY) as response:
        async for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices")
                if choices and choices[0]["delta"].get("content"):
                    count += 1
    return count


async def run(base_url: str, streams: int, how: str, transport: str) -> dict[str, Any]:
    http = openai.DefaultAioHttpClient(timeout=120) if transport == "aiohttp" else None
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=120, http_client=http)
    read = sdk_chunks if how == "sdk-chunks" else raw_lines
    try:
        await read(client)  # warm-up: the SDK imports its types on first use
        cpu, start = cpu_s(), time.perf_counter()
        counts = await asyncio.gather(*(read(client) for _ in range(streams)))
        wall, cpu = time.perf_counter() - start, cpu_s() - cpu
    finally:
        await client.close()
    chunks = sum(counts)
    return {
        "read": how,
        "transport": transport,
        "chunks": chunks,
        "wall_s": round(wall, 2),
        "cpu_us_per_chunk": round(1e6 * cpu / max(chunks, 1), 1),
        "cpu_pct": round(100 * cpu / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--tps", type=float, default=50.0)
    parser.add_argument("--tokens", type=int, default=150)
    args = parser.parse_args()
    results = []
    with FakeOpenAIProcess() as server:
        reply = " ".join(f"t{i}" for i in range(args.tokens))
        server.set_default(Scenario(reply=reply, tokens_per_second=args.tps))
        for transport in ("httpx2", "aiohttp"):
            for how in ("sdk-chunks", "raw-lines"):
                server.reset()
                results.append(asyncio.run(run(server.base_url, args.streams, how, transport)))
                print(json.dumps(results[-1]), file=sys.stderr)
    print(json.dumps({"streams": args.streams, "tokens_per_s": args.tps, "results": results}))


if __name__ == "__main__":
    main()
