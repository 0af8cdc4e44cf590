"""`specwise serve --ray` on a Ray cluster this module starts: a head and a second node on this machine (loopback
only, one CPU each, a small object store, no dashboard), the application deployed with two replicas of one thread.

Requests spread over both replicas and get the answers of a single in-process server; a replica killed while it
holds requests loses none that had not started streaming (they are sent again to the other replica), a stream it
had started ends with an error event, and the deployment comes back to two replicas. The cluster is torn down at
the end. Run by ``make test-cluster`` (which installs Ray); skipped where Ray is not installed (the checks of the
options, which need no cluster, run everywhere).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

# Ray on loopback only: with this set before Ray is imported, Ray takes 127.0.0.1 as this machine's address (its
# setting for machines that must not form clusters with others), so that no node listens on a public interface and
# the driver finds the nodes started on 127.0.0.1 (their own address would otherwise be the machine's).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

for _name in ("httpx", "openai", "fastapi"):
    pytest.importorskip(_name, reason="needs the server extra and the test tools: pip install 'specwise[dev]'")

import httpx  # noqa: E402
import openai  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from conftest import tiny_llama  # noqa: E402
from specwise.cli import main  # noqa: E402
from specwise.runtime import build_runtime  # noqa: E402
from specwise.server.app import create_app  # noqa: E402
from specwise.server.ray import (  # noqa: E402
    APP_NAME,
    GATEWAY_MAX_BODY_BYTES,
    REPLICA_HEADER,
    RETRIES_HEADER,
    ClusterOptions,
    _check_target_here,
    _deploy_failure,
    deploy,
    replica_threads,
)

try:
    import ray
    from ray import serve
except ModuleNotFoundError:  # the tests that need a cluster are skipped
    ray = serve = None

needs_ray = pytest.mark.skipif(
    ray is None, reason="Ray Serve is not installed: make setup-cluster (pip install 'specwise[cluster]')"
)
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "tiny"
MIB = 1024 * 1024
READY_SECONDS = 240.0  # for the cluster, the deployment, or a replaced replica (a bound, not an expectation)
TIMEOUT = 180.0  # per request
PROMPTS = ["Name three primary colors.", "Write a haiku about rain.", "Count: one two three"]
LONG = 440  # tokens of the requests a replica is killed under (the context is 512)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smol_tokenizer) -> str:
    """A small random Llama with the default model's tokenizer, slow enough (a few ms a token) that a replica
    can be killed while it holds requests."""
    path = tmp_path_factory.mktemp("cluster-model")
    tiny_llama(seed=5, vocab=len(smol_tokenizer), hidden=128, layers=2).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(model_dir):
    """The single server (in-process, one request at a time): the answers the cluster must give."""
    app = create_app(build_runtime(model_dir, "none", 4, "cpu"), model_name=MODEL, max_batch=1)
    with TestClient(app) as client:
        answers: dict[tuple[str, int], str] = {}

        def answer(prompt: str, max_tokens: int) -> str:
            if (prompt, max_tokens) not in answers:
                body = chat(prompt, max_tokens, stream=False)
                response = client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                answers[prompt, max_tokens] = response.json()["choices"][0]["message"]["content"]
            return answers[prompt, max_tokens]

        yield answer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(model_dir):
    """A head and a second node on 127.0.0.1 with one CPU each, the application deployed with two replicas of
    one thread; yields the base URL. Everything is shut down at the end, and the test checks it was."""
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 80 * MIB, "node_ip_address": "127.0.0.1"}
    mini = Cluster(initialize_head=True, head_node_args=node | {"include_dashboard": False})
    try:
        mini.add_node(**node)
        mini.wait_for_nodes(timeout=READY_SECONDS)
        ray.init(address=mini.address, include_dashboard=False, log_to_driver=False)
        options = ClusterOptions(
            target=model_dir, drafter="ngram", gamma=4, device="cpu", served_model_name=MODEL, max_batch=2, replicas=2
        )
        url = deploy(options, host="127.0.0.1", port=_free_port(), proxy_location="HeadOnly")
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()
        nodes = [mini.head_node, *mini.worker_nodes] if mini.head_node else list(mini.worker_nodes)
        mini.shutdown()
        assert not any(n.any_processes_alive() for n in nodes), "the cluster's processes outlived the tests"


def chat(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def post(
    url: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    started: threading.Event | None = None,
    result: dict | None = None,
) -> dict:
    """One chat request; returns its status, replica, retries, text, whether text had streamed, and any error
    (filled into ``result`` as they come, when given)."""
    result = {} if result is None else result
    result |= {"status": None, "replica": None, "retries": 0, "text": "", "streamed": False, "error": None}
    try:
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=chat(prompt, max_tokens, stream), timeout=TIMEOUT
        ) as r:
            result["status"] = r.status_code
            result["replica"] = r.headers.get(REPLICA_HEADER)
            result["retries"] = int(r.headers.get(RETRIES_HEADER, "0"))
            if not stream:
                body = json.loads(r.read())
                if r.status_code == 200:
                    result["text"] = body["choices"][0]["message"]["content"]
                else:
                    result["error"] = body["error"]["message"]
                return result
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    result["error"] = event["error"]["message"]
                    continue
                delta = event["choices"][0]["delta"].get("content") if event.get("choices") else None
                if delta:
                    result["text"] += delta
                    result["streamed"] = True
                    if started is not None:
                        started.set()
    except httpx.HTTPError as err:
        result["error"] = f"{type(err).__name__}: {err}"
    return result


def run_all(calls: list) -> list[dict]:
    """Run ``post`` calls (argument tuples) on threads at once; returns their results in order."""
    results: list[dict | None] = [None] * len(calls)

    def one(i: int) -> None:
        results[i] = post(*calls[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT + 30)
    assert all(r is not None for r in results), "a request thread did not finish"
    return results


REPLICA_ACTOR = f"SERVE_REPLICA::{APP_NAME}#SpecwiseEngine#"  # Ray Serve's name of a replica's actor, before its id


def engine_replicas() -> dict[str, int]:
    """The engine deployment's replicas by state."""
    status = serve.status().applications[APP_NAME].deployments["SpecwiseEngine"]
    return {str(getattr(state, "value", state)): n for state, n in status.replica_states.items() if n}


def replica_ids() -> set[str]:
    """The ids of the engine's live replica actors (starting or running)."""
    names = ray.util.list_named_actors(all_namespaces=True)
    return {a["name"][len(REPLICA_ACTOR) :] for a in names if a["name"].startswith(REPLICA_ACTOR)}


def wait_for_running(count: int, gone: str | None = None) -> float:
    """Seconds until the engine deployment has ``count`` running replicas, none of them ``gone`` (bounded)."""
    start = time.monotonic()
    while engine_replicas() != {"RUNNING": count} or len(replica_ids() - {gone}) != count:
        assert time.monotonic() - start < READY_SECONDS, f"replicas did not recover: {engine_replicas()}"
        time.sleep(0.25)
    return time.monotonic() - start


# --------------------------------------------------------------------------------------------------- tests


@needs_ray
def test_requests_spread_over_two_replicas_with_the_single_server_answers(cluster, reference):
    calls = [(cluster, PROMPTS[i % len(PROMPTS)], 24, i % 2 == 0) for i in range(8)]
    results = run_all(calls)  # 8 at once, 2 per replica at a time: both replicas serve
    assert [r["error"] for r in results] == [None] * 8
    assert all(r["status"] == 200 for r in results)
    assert len({r["replica"] for r in results}) == 2
    for (_, prompt, max_tokens, _), result in zip(calls, results):
        assert result["text"] == reference(prompt, max_tokens)


@needs_ray
def test_the_openai_client_and_the_other_routes_work_against_the_cluster(cluster, reference):
    client = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPTS[0]}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference(PROMPTS[0], 16)
    assert chunks[-1].usage.completion_tokens == 16
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.completions.create(model="another", prompt="Hi", max_tokens=2)
    health = httpx.get(f"{cluster}/health", timeout=TIMEOUT).json()
    assert health["status"] == "ok" and health["max_batch"] == 2


@needs_ray
def test_a_killed_replica_loses_no_request_that_had_not_started_streaming(cluster, reference):
    wait_for_running(2)
    started = threading.Event()
    probe: dict = {}
    thread = threading.Thread(target=post, args=(cluster, PROMPTS[0], LONG, True, started, probe))
    thread.start()  # a long stream: once it has started, its replica is the one to kill
    assert started.wait(TIMEOUT), "the probe request did not start streaming"
    # the rest fill both replicas (two requests each at a time) and queue at the gateway; none streams
    calls = [(cluster, PROMPTS[i % len(PROMPTS)], LONG, False) for i in range(6)]
    results: list[dict] = []
    rest = threading.Thread(target=lambda: results.extend(run_all(calls)))
    rest.start()
    time.sleep(1.0)  # for the first of them to reach the replicas (what is asserted does not depend on it)
    victim = probe["replica"]
    assert victim in replica_ids()
    ray.kill(ray.get_actor(REPLICA_ACTOR + victim, namespace="serve"), no_restart=True)
    killed_at = time.monotonic()
    thread.join(TIMEOUT + 30)
    rest.join(2 * TIMEOUT + 60)

    # every request that had not streamed is answered, the greedy answer of the single server
    assert [r["error"] for r in results] == [None] * len(calls)
    for (_, prompt, max_tokens, _), result in zip(calls, results):
        assert result["status"] == 200
        assert result["text"] == reference(prompt, max_tokens)
    assert any(r["retries"] > 0 for r in results), "the killed replica held no request: nothing was tested"
    assert all(r["replica"] != victim for r in results if r["retries"] > 0)
    # the stream that had started ends with a clear error (or had finished before the kill)
    assert probe["streamed"]
    if probe["error"] is not None:
        assert "replica" in probe["error"] and "failed" in probe["error"]
        assert reference(PROMPTS[0], LONG).startswith(probe["text"])
    else:
        assert probe["text"] == reference(PROMPTS[0], LONG)

    retried = sum(r["retries"] > 0 for r in results)
    print(
        f"killed replica {victim}: {retried} of {len(results)} unstreamed requests sent again; probe: {probe['error']}"
    )
    recovery = time.monotonic() - killed_at + wait_for_running(2, gone=victim)
    print(f"recovered to 2 running replicas {recovery:.1f} s after the kill")
    after = run_all([(cluster, PROMPTS[1], 8, True) for _ in range(6)])
    assert [r["error"] for r in after] == [None] * 6
    assert victim not in {r["replica"] for r in after} and len({r["replica"] for r in after}) == 2


def _cancelled(url: str, replica: str) -> float:
    """The replica's count of cancelled chat requests, from its /metrics. Ray routes to an idle replica on the
    gateway's node first: the requests go several at once, so that some reach the other replica too."""
    deadline = time.monotonic() + READY_SECONDS
    with ThreadPoolExecutor(8) as pool:
        while time.monotonic() < deadline:
            for response in pool.map(lambda _: httpx.get(f"{url}/metrics", timeout=TIMEOUT), range(8)):
                if response.headers.get(REPLICA_HEADER) == replica:
                    lines = response.text.splitlines()
                    found = [
                        x for x in lines if x.startswith('specwise_requests_total{endpoint="chat",outcome="cancelled"}')
                    ]
                    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0
    raise AssertionError(f"no answer from replica {replica}")


@needs_ray
def test_a_client_that_goes_away_cancels_its_generation_on_the_replica(cluster):
    with httpx.stream(
        "POST", f"{cluster}/v1/chat/completions", json=chat(PROMPTS[2], LONG, True), timeout=TIMEOUT
    ) as r:
        replica = r.headers[REPLICA_HEADER]
        before = _cancelled(cluster, replica)
        next(r.iter_lines())  # it has started; the client leaves
    deadline = time.monotonic() + READY_SECONDS
    while (count := _cancelled(cluster, replica)) == before:
        assert time.monotonic() < deadline, "the replica did not cancel the request of a client that went away"
        time.sleep(0.1)
    assert count == before + 1


@needs_ray
def test_bodies_over_the_limits_are_refused_by_the_gateway_and_by_the_replica(cluster):
    url = f"{cluster}/v1/chat/completions"
    past_replica = b'{"model": "tiny", "messages": [], "x": "' + b"a" * (2 * MIB) + b'"}'
    refused = httpx.post(url, content=past_replica, headers={"content-type": "application/json"}, timeout=TIMEOUT)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"
    assert refused.headers.get(REPLICA_HEADER)  # the replica's own limit (1 MiB for this model)
    past_gateway = b"a" * (GATEWAY_MAX_BODY_BYTES + 1)
    refused = httpx.post(url, content=past_gateway, headers={"content-type": "application/json"}, timeout=TIMEOUT)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"
    assert refused.headers.get(REPLICA_HEADER) is None  # refused before any replica saw it


# ---------------------------------------------------------------------------------- options (no cluster needed)


@pytest.mark.parametrize("flag", [["--replicas", "2"], ["--address", "head:6379"], ["--max-replicas", "4"]])
def test_cluster_flags_without_ray_are_one_line_naming_the_fix(capsys, flag):
    assert main(["serve", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag[0] in err and "add --ray" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--replicas", "3", "--max-replicas", "2"], "--max-replicas (2) must be >= --replicas (3)"),
        (["--gateways", "0"], "--gateways must be >= 1"),
        (["--target", "/nowhere/model.gguf"], "no such file on node"),
    ],
)
def test_bad_cluster_options_are_refused_before_ray_starts(monkeypatch, capsys, argv, message):
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray is never reached: the options are checked first
    assert main(["serve", "--ray", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_an_address_where_no_cluster_answers_is_refused_at_once(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is imported (Ray would retry for minutes)
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    assert main(["serve", "--ray", "--address", address]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--address {address}: no Ray cluster answers there" in err


def test_serve_ray_without_ray_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # None in sys.modules: the import fails as if not installed
    assert main(["serve", "--ray", "--target", "default"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'specwise[cluster]'" in err


def test_replica_threads_follow_the_cpus_ray_gives():
    assert replica_threads({"CPU": 4.0, "memory": 1e9}) == 4
    assert replica_threads({"CPU": 1.5}) == 1
    assert replica_threads({"CPU": 0.5}) == 1 and replica_threads({}) == 1


def test_a_target_path_missing_on_a_node_names_the_node_and_the_fix(tmp_path):
    _check_target_here("default")  # the packaged model: no path to check
    _check_target_here(str(tmp_path))  # present
    with pytest.raises(FileNotFoundError, match=r"no such file on node .*: put the model on a path every node"):
        _check_target_here(str(tmp_path / "absent.gguf"))


def test_a_failed_deployment_is_reported_in_one_line():
    report = (
        "Deploying application specwise failed: ...\nTraceback (most recent call last):\n  File ...\n"
        "FileNotFoundError: --target /m.gguf: no such file on node b: put the model on a path every node can read\n"
    )
    line = "--target /m.gguf: no such file on node b: put the model on a path every node can read"
    assert _deploy_failure(report) == f"a replica could not start: {line}"
    assert _deploy_failure("something else\nlast line") == "the deployment failed: last line"
