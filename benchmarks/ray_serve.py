"""What Ray costs: `specwise serve --ray` (2 replicas x 1 thread) against two plain `specwise serve` processes
(1 thread each, the clients split between them), and optionally one plain server with 2 threads, on this machine;
then, with --kill, a replica killed under load. Each measured load also records where the cores went (CPU seconds
per process over the load's wall time, by role: replicas, gateway, Ray's proxy, controller, raylet and GCS, plain
servers, this process's clients).

Every configuration runs alone in its turn (started, warmed up, measured, stopped), interleaved over --rounds, so
that an idle Ray cluster does not slow the plain servers nor the other way round. Each measured level sends the
same --requests streamed chat requests (greedy, --max-tokens each, Spec-Bench questions with --questions, else the
project's own prompts) from --clients concurrent clients with the official openai client, each client sending
its share one after another. Records tokens/s over all clients per round and the answers: every configuration's
greedy answers must be equal (reported, and the run fails if not). The ratio reported is Ray's tokens/s over the
two plain servers', per round, and its median.

The kill run (--kill): the Ray deployment under the same load, half the requests streamed, half not, and one
replica killed (ray.kill) --kill-after seconds in; counts requests answered in full, streams that had started and
ended with an error, and requests lost without having streamed anything (the goal: none), and times the
deployment's recovery (the kill until two replicas run again) and the first answer from the new replica.

    python benchmarks/ray_serve.py --target default --drafter auto --max-batch 8 --clients 8 --requests 32 \
        --max-tokens 128 --rounds 3 --single --kill --questions question.jsonl \
        --out benchmarks/results/ray_serve/ray_serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server_load  # noqa: E402  (its server start-up, prompts and environment)

from specwise.lab.bench.runner import emit_json, script_header  # noqa: E402

CLUSTER_HEADER_REPLICA = "x-specwise-replica"
CLUSTER_HEADER_RETRIES = "x-specwise-retries"
REPLICA_PREFIX = "SERVE_REPLICA::specwise#SpecwiseEngine#"  # Ray Serve's name of a replica's actor, before its id


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", default="auto")
    p.add_argument("--gamma", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--impl", default="auto", choices=["auto", "native", "hf"])
    p.add_argument("--max-batch", type=int, default=8, help="--max-batch of every server and replica (default 8)")
    p.add_argument("--clients", type=int, default=8, help="concurrent streaming clients (default 8)")
    p.add_argument("--requests", type=int, default=32, help="requests per configuration and round (default 32)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="rounds, every configuration once per round (default 3)")
    p.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    p.add_argument("--single", action="store_true", help="also one plain server with 2 threads")
    p.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    p.add_argument("--kill", action="store_true", help="also the replica-kill run (after the rounds)")
    p.add_argument("--kill-after", type=float, default=5.0, help="seconds into the kill run's load (default 5)")
    p.add_argument("--kill-requests", type=int, default=48, help="requests of the kill run (default 48)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per request")
    p.add_argument("--out", default=None, help="JSON file (default: print)")
    args = p.parse_args(argv)
    args.temperature = 0.0
    return args


# ---------------------------------------------------------------------------------------------------- clients


async def one_request(api, model: str, prompt: str, args: argparse.Namespace, stream: bool = True) -> dict:
    """One greedy chat request (streamed by default): its text, tokens, the replica that answered, whether any text
    had come before an error, and the error."""
    import openai

    result = {"prompt": prompt, "text": "", "tokens": 0, "replica": None, "retries": 0, "streamed": False}
    result["error"] = None
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens}
    body |= {"temperature": 0.0}
    try:
        if stream:
            raw = await api.chat.completions.with_raw_response.create(
                **body, stream=True, stream_options={"include_usage": True}
            )
            _note_headers(result, raw.headers)
            async for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    result["text"] += chunk.choices[0].delta.content
                    result["streamed"] = True
                if chunk.usage is not None:
                    result["tokens"] = chunk.usage.completion_tokens
        else:
            raw = await api.chat.completions.with_raw_response.create(**body)
            _note_headers(result, raw.headers)
            completion = raw.parse()
            result["text"] = completion.choices[0].message.content or ""
            result["tokens"] = completion.usage.completion_tokens
    except openai.APIError as err:
        result["error"] = f"{type(err).__name__}: {err}"
    return result


def _note_headers(result: dict, headers) -> None:
    result["replica"] = headers.get(CLUSTER_HEADER_REPLICA)
    result["retries"] = int(headers.get(CLUSTER_HEADER_RETRIES, "0"))


async def run_load(urls: list[str], model: str, args: argparse.Namespace, requests: int, streams=None) -> dict:
    """``requests`` requests from ``args.clients`` clients, client i on ``urls[i % len(urls)]`` sending requests
    i, i + c, ... in turn; ``streams(j)`` says whether request j streams (default: all)."""
    import openai

    pool = args.prompt_texts
    prompts = [pool[j % len(pool)] for j in range(requests)]
    clients = args.clients

    async def client(i: int) -> list[dict]:
        url = urls[i % len(urls)]
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=args.timeout, max_retries=0)
        async with api:
            done = []
            for j in range(i, requests, clients):
                stream = True if streams is None else streams(j)
                done.append(await one_request(api, model, prompts[j], args, stream) | {"index": j, "stream": stream})
            return done

    start = time.perf_counter()
    results = await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - start
    flat = sorted((r for rs in results for r in rs), key=lambda r: r["index"])
    tokens = sum(r["tokens"] for r in flat if r["error"] is None)
    return {"wall_seconds": wall, "completion_tokens": tokens, "tokens_per_second": tokens / wall, "requests": flat}


async def warm_up(urls: list[str], model: str, args: argparse.Namespace) -> None:
    """Not measured: --clients requests at once on every URL, so that every replica has answered before."""
    import openai

    for url in urls:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=args.timeout) as api:
            await asyncio.gather(*(one_request(api, model, "Hello.", args) for _ in range(args.clients)))


# ------------------------------------------------------------------------------------------- where the CPU goes

ROLES = (  # (role, a part of the process's command line that names it), first match wins
    ("replica", "SpecwiseEngine"),
    ("gateway", "SpecwiseGateway"),
    ("Ray HTTP proxy", "ProxyActor"),
    ("Ray controller", "ServeController"),
    ("Ray raylet", "raylet"),
    ("Ray GCS", "gcs_server"),
    ("plain server", "specwise serve"),
    ("plain server", "specwise.server"),
)


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """Every process's (command line, CPU seconds so far), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry)] = (cmd, (int(fields[11]) + int(fields[12])) / tick)
    return found


def cpu_split(before: dict, after: dict, wall: float) -> dict[str, float]:
    """Cores used per role over ``wall`` seconds (this process's clients as "clients", the rest as "other")."""
    me = os.getpid()
    split: dict[str, float] = {}
    for pid, (cmd, seconds) in after.items():
        used = seconds - before.get(pid, (cmd, 0.0))[1]
        if used <= 0:
            continue
        role = "clients" if pid == me else next((r for r, part in ROLES if part in cmd), "other")
        split[role] = split.get(role, 0.0) + used / wall
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


# ---------------------------------------------------------------------------------------------------- servers


@contextlib.contextmanager
def ray_deployment(args: argparse.Namespace):
    """A local Ray cluster (--ray-cpus CPUs, loopback) with the application: 2 replicas x 1 thread."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback addresses only
    import ray
    from ray import serve

    from specwise.server.ray import ClusterOptions, deploy

    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False, object_store_memory=100 << 20)
    try:
        options = ClusterOptions(
            target=args.target,
            drafter=args.drafter,
            gamma=args.gamma,
            device=args.device,
            impl=args.impl,
            max_batch=args.max_batch,
            replicas=2,
            cpus_per_replica=1,
        )
        url = deploy(options, "127.0.0.1", server_load.free_port(), proxy_location="HeadOnly")
        import httpx

        model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        yield {"urls": [url], "model": model, "kind": "ray 2 replicas x 1 thread"}
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def plain_servers(args: argparse.Namespace, count: int, threads: int):
    """``count`` plain `specwise serve` processes with ``threads`` threads each."""
    server_args = argparse.Namespace(**vars(args))
    server_args.threads = threads
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(server_load.specwise_server(server_args, args.drafter, args.max_batch))
            for _ in range(count)
        ]
        kind = f"{count} plain server(s) x {threads} thread(s)"
        yield {"urls": [s["url"] for s in servers], "model": servers[0]["model"], "kind": kind}


def configurations(args: argparse.Namespace) -> dict:
    found = {"ray": lambda: ray_deployment(args), "plain_two": lambda: plain_servers(args, 2, 1)}
    if args.single:
        found["plain_one_two_threads"] = lambda: plain_servers(args, 1, 2)
    return found


# --------------------------------------------------------------------------------------------------- kill run


def kill_run(args: argparse.Namespace) -> dict:
    """The Ray deployment under load, one replica killed --kill-after seconds in."""
    from ray import serve

    with ray_deployment(args) as server:
        asyncio.run(warm_up(server["urls"], server["model"], args))
        return asyncio.run(_kill_under_load(server, args, serve))


async def _kill_under_load(server: dict, args: argparse.Namespace, serve) -> dict:
    import ray

    load = asyncio.create_task(
        run_load(server["urls"], server["model"], args, args.kill_requests, streams=lambda j: j % 2 == 0)
    )
    await asyncio.sleep(args.kill_after)
    replicas = _replica_ids()
    victim = replicas[0] if replicas else None
    killed_at = time.monotonic()
    if victim is not None:
        ray.kill(ray.get_actor(f"{REPLICA_PREFIX}{victim}", namespace="serve"), no_restart=True)
    recovered = None
    while recovered is None and time.monotonic() - killed_at < 600:
        ids = _replica_ids()
        if len(ids) == 2 and victim not in ids and _engine_states(serve) == {"RUNNING": 2}:
            recovered = time.monotonic() - killed_at
        await asyncio.sleep(0.2)
    result = await load
    requests = result["requests"]
    lost = [r for r in requests if r["error"] is not None and not r["streamed"]]
    cut = [r for r in requests if r["error"] is not None and r["streamed"]]
    return {
        "victim": victim,
        "killed_after_seconds": args.kill_after,
        "requests": len(requests),
        "answered": sum(r["error"] is None for r in requests),
        "sent_again": sum(r["retries"] > 0 for r in requests),
        "streams_cut_after_starting": len(cut),
        "lost_without_streaming": len(lost),
        "lost_errors": [r["error"] for r in lost],
        "recovery_seconds": recovered,
        "tokens_per_second": result["tokens_per_second"],
        "texts": {r["prompt"]: r["text"] for r in requests if r["error"] is None},
    }


def _engine_states(serve) -> dict[str, int]:
    """The engine deployment's replicas by state (``{"RUNNING": 2}``)."""
    details = serve.status().applications.get("specwise")
    if details is None:
        return {}
    states = details.deployments["SpecwiseEngine"].replica_states
    return {str(getattr(state, "value", state)): n for state, n in states.items() if n}


def _replica_ids() -> list[str]:
    """The ids of the engine's live replica actors (starting or running)."""
    import ray

    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"][len(REPLICA_PREFIX) :] for a in names if a["name"].startswith(REPLICA_PREFIX))


# -------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.prompt_texts = server_load.prompt_texts(args)
    configs = configurations(args)
    rounds: dict[str, list[dict]] = {name: [] for name in configs}
    kinds: dict[str, str] = {}
    for index in range(args.rounds):
        for name, start in configs.items():
            with start() as server:
                kinds[name] = server["kind"]
                asyncio.run(warm_up(server["urls"], server["model"], args))
                before = cpu_seconds()
                done = asyncio.run(run_load(server["urls"], server["model"], args, args.requests))
                done["cores_used"] = cpu_split(before, cpu_seconds(), done["wall_seconds"])
            rounds[name].append(done)
            print(f"round {index + 1}, {name}: {done['tokens_per_second']:.1f} tokens/s", file=sys.stderr)
    answers = {name: [{r["prompt"]: r["text"] for r in rnd["requests"]} for rnd in rs] for name, rs in rounds.items()}
    reference = answers["plain_two"][0]
    unequal = sorted(
        {p for runs in answers.values() for run in runs for p, text in run.items() if reference.get(p) != text}
    )
    errors = [r["error"] for rs in rounds.values() for rnd in rs for r in rnd["requests"] if r["error"]]
    ratios = [a["tokens_per_second"] / b["tokens_per_second"] for a, b in zip(rounds["ray"], rounds["plain_two"])]
    summary = {
        name: {
            "kind": kinds[name],
            "tokens_per_second_median": statistics.median(r["tokens_per_second"] for r in rs),
            "tokens_per_second": [r["tokens_per_second"] for r in rs],
            "cores_used_median": {
                role: statistics.median(r["cores_used"].get(role, 0.0) for r in rs)
                for role in {role for r in rs for role in r["cores_used"]}
            },
        }
        for name, rs in rounds.items()
    }
    result = {
        **script_header(argv),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "prompt_texts")},
        "environment": server_load.environment(args),
        "summary": summary,
        "ray_over_two_plain": {"per_round": ratios, "median": statistics.median(ratios)},
        "answers_equal": not unequal,
        "prompts_with_unequal_answers": unequal,
        "errors": errors,
        "rounds": rounds,
    }
    if args.single:
        single = [
            a["tokens_per_second"] / b["tokens_per_second"]
            for a, b in zip(rounds["plain_one_two_threads"], rounds["plain_two"])
        ]
        result["one_server_two_threads_over_two_plain"] = {"per_round": single, "median": statistics.median(single)}
    if args.kill:
        killed = kill_run(args)
        killed["texts_equal"] = all(reference.get(p, text) == text for p, text in killed.pop("texts").items())
        result["kill"] = killed
    emit_json(result, args.out)
    print(_table(result), file=sys.stderr)
    print(f"command: python benchmarks/ray_serve.py {shlex.join(argv or sys.argv[1:])}", file=sys.stderr)
    return 0 if result["answers_equal"] and not errors else 1


def _table(result: dict) -> str:
    rows = ["| configuration | tokens/s (median) | per round |", "|---|---:|---|"]
    for s in result["summary"].values():
        per = ", ".join(f"{x:.1f}" for x in s["tokens_per_second"])
        rows.append(f"| {s['kind']} | {s['tokens_per_second_median']:.1f} | {per} |")
    for s in result["summary"].values():
        used = ", ".join(f"{role} {cores:.2f}" for role, cores in sorted(s["cores_used_median"].items()))
        rows.append(f"cores used, {s['kind']}: {used}")
    rows.append(f"\nRay / two plain servers: {result['ray_over_two_plain']['median']:.3f} (median of rounds)")
    rows.append(f"answers equal: {result['answers_equal']}; errors: {len(result['errors'])}")
    if "kill" in result:
        k = result["kill"]
        rows.append(
            f"kill: {k['answered']}/{k['requests']} answered, {k['sent_again']} sent again, "
            f"{k['streams_cut_after_starting']} streams cut after starting, {k['lost_without_streaming']} lost "
            f"without streaming; recovery {k['recovery_seconds']} s"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
