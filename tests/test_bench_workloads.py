"""The coding workloads of ``specwise bench --workload``: the shipped data, the stream arithmetic, the runner's
pairing and greedy check, the report, and one request of each workload through a live server (slow)."""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest

from specwise.lab.bench.workloads import WORKLOADS, Request, load_items, workload_requests
from specwise.lab.bench.workloads.build import CPYTHON_VERSION, build_all
from specwise.lab.bench.workloads.client import Sampling, StreamEvent, chat, stream_figures
from specwise.lab.bench.workloads.report import check_results, render_markdown, write_report
from specwise.lab.bench.workloads.runner import WorkloadSettings, run_workloads
from specwise.lab.bench.workloads.servers import ASKED_ONLY, CONFIG_IDS, make_configs


def needs_extra(extra: str) -> None:
    """Skip the calling test unless the modules of ``extra`` are installed (the command checks them first)."""
    import importlib.util

    from specwise.extras import EXTRAS

    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs the {extra} extra ({', '.join(missing)} not installed)")


STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _stdlib_is_the_source() -> bool:
    item = load_items("code-edit")[0]
    path = STDLIB / item["source"]["path"].removeprefix("Lib/")
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == item["source"]["sha256"]


# ------------------------------------------------------------------------------------------------------ the data


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_workload_files_load_with_unique_ids_and_named_sources(workload):
    items = load_items(workload)
    assert len({it["id"] for it in items}) == len(items)
    sources = [s for it in items for s in (it.get("sources") or [it["source"]])]
    assert sources and all(s["cpython"] == CPYTHON_VERSION and s["path"].startswith("Lib/") for s in sources)
    assert all(len(s["sha256"]) == 64 for s in sources)


def test_code_edits_carry_their_original_in_the_prompt_and_as_the_prediction():
    items = load_items("code-edit")
    assert {it["kind"] for it in items} == {"function", "file"}
    for item, request in zip(items, workload_requests("code-edit")):
        assert item["original"] in item["messages"][-1]["content"]
        assert request.prediction == item["original"] and not request.is_fim


def test_fim_cuts_join_back_to_the_span_they_were_cut_from():
    for item in load_items("fim"):
        joined = item["prefix"] + item["middle"] + item["suffix"]
        assert hashlib.sha256(joined.encode()).hexdigest() == item["span_sha256"]
        first, last = item["source"]["middle_lines"]
        assert item["middle"].count("\n") == last - first + 1
        assert item["middle"].strip() and item["prefix"] and item["suffix"]


@pytest.mark.skipif(not _stdlib_is_the_source(), reason=f"needs CPython {CPYTHON_VERSION}'s standard library")
def test_the_shipped_files_are_what_the_build_makes_from_cpython_source():
    built = build_all(STDLIB)
    for workload, name in WORKLOADS.items():
        assert built[name] == load_items(workload), name
    for item in load_items("fim"):  # and each cut is the real file's lines
        lines = (STDLIB / item["source"]["path"].removeprefix("Lib/")).read_text().splitlines(keepends=True)
        start, end = item["source"]["lines"]
        assert item["prefix"] + item["middle"] + item["suffix"] == "".join(lines[start - 1 : end])


def test_a_cut_that_does_not_join_back_is_refused_naming_the_line(tmp_path):
    items = load_items("fim")
    items[1]["middle"] += "    pass\n"
    path = tmp_path / "fim.jsonl"
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    with pytest.raises(ValueError, match=r"fim\.jsonl:2: .*span_sha256"):
        load_items("fim", path)


def test_agent_traces_answer_every_call_with_a_real_result_and_request_each_assistant_turn():
    for trace in load_items("agent"):
        names = {t["function"]["name"] for t in trace["tools"]}
        messages = trace["messages"]
        for i, m in enumerate(messages):
            for call in m.get("tool_calls") or []:
                assert call["function"]["name"] in names
                json.loads(call["function"]["arguments"])
                assert messages[i + 1]["role"] == "tool" and messages[i + 1]["tool_call_id"] == call["id"]
        requests = [r for r in workload_requests("agent") if r.item_id == trace["id"]]
        assert len(requests) == sum(m["role"] == "assistant" for m in messages)
        for r in requests:  # the history so far, ending before the assistant speaks
            assert messages[len(r.messages)]["role"] == "assistant" and r.messages == messages[: len(r.messages)]
            if r.prediction is not None:  # an answer after a tool result: it quotes the result
                assert r.messages[-1]["role"] == "tool" and r.prediction == r.messages[-1]["content"]
    files = [m["content"] for t in load_items("agent") for m in t["messages"] if m["role"] == "tool"]
    assert any("def insort_left" in f for f in files)


# ------------------------------------------------------------------------------------------------------ streams


def test_stream_figures_count_tokens_after_the_first_over_the_time_they_took():
    events = [StreamEvent(10.5, "a"), StreamEvent(10.6, ""), StreamEvent(10.7, "b"), StreamEvent(11.0, "c")]
    f = stream_figures(10.0, events, 11.1, completion_tokens=7)
    assert f["seconds"] == pytest.approx(1.1) and f["ttft_seconds"] == pytest.approx(0.5)
    assert f["decode_seconds"] == pytest.approx(0.5)
    assert f["decode_tokens_per_second"] == pytest.approx(6 / 0.5)
    assert f["tokens_per_second"] == pytest.approx(7 / 1.1)
    assert f["text"] == "abc"
    # without a usage chunk each output chunk counts as one token
    assert stream_figures(10.0, events, 11.1, None)["decode_tokens_per_second"] == pytest.approx(2 / 0.5)


def test_stream_figures_leave_decode_speed_empty_without_two_tokens():
    one = stream_figures(0.0, [StreamEvent(1.0, "x")], 1.0, 1)
    assert one["decode_tokens_per_second"] is None and one["tokens_per_second"] == 1.0
    none = stream_figures(0.0, [], 2.0, 0)
    assert none["ttft_seconds"] is None and none["decode_tokens_per_second"] is None


def test_a_reply_that_came_at_once_takes_the_servers_decode_rate():
    from specwise.lab.bench.workloads.client import with_server_rate

    # a tool call parsed from the whole output: two chunks a millisecond apart at the end of 29 tokens
    call = stream_figures(0.0, [StreamEvent(1.000, "read_file"), StreamEvent(1.001, '{"path": "a.py"}')], 1.0, 29)
    assert call["decode_tokens_per_second"] == pytest.approx(28 / 0.001)  # what the stream alone would claim
    settled = with_server_rate(call, 31.5)
    assert settled["decode_tokens_per_second"] == 31.5 and settled["decode_measured_by"] == "server"
    assert settled["stream_decode_tokens_per_second"] == pytest.approx(28_000)
    assert with_server_rate(call, None)["decode_tokens_per_second"] is None  # no rate rather than an absurd one
    one = with_server_rate(stream_figures(0.0, [StreamEvent(1.0, "x")], 1.0, 1), 24.9)
    assert one["decode_tokens_per_second"] is None and one["decode_measured_by"] is None  # one token: nothing to time
    # a streamed reply keeps the stream's rate (what a user sees), the server's beside it
    events = [StreamEvent(1.0 + 0.1 * i, "x") for i in range(5)]
    streamed = with_server_rate(stream_figures(0.0, events, 1.4, 5), 9.0)
    assert streamed["decode_tokens_per_second"] == pytest.approx(4 / 0.4) and streamed["decode_measured_by"] == "stream"
    assert streamed["server_decode_tokens_per_second"] == 9.0


def test_the_servers_own_decode_rate_reads_specwise_statistics_and_llama_cpp_timings():
    from specwise.lab.bench.workloads.client import server_decode_rate

    spec = {"new_tokens": 30, "total_seconds": 2.5, "prefill_seconds": 0.5}
    assert server_decode_rate(spec, None) == pytest.approx(15.0)
    assert server_decode_rate(None, {"predicted_per_second": 42.5}) == 42.5
    assert server_decode_rate({"new_tokens": 0, "total_seconds": 1.0}, None) is None
    assert server_decode_rate(None, None) is None


def _chunk(text=None, calls=None, finish=None, usage=None):
    delta = SimpleNamespace(content=text, tool_calls=calls)
    choices = (
        []
        if text is None and calls is None and finish is None
        else [SimpleNamespace(delta=delta, finish_reason=finish)]
    )
    return SimpleNamespace(choices=choices, usage=usage, model_extra={})


class FakeClient:
    """An ``openai`` client whose chat stream is given; it keeps the arguments it was called with."""

    def __init__(self, chunks):
        self.chunks, self.kwargs = chunks, None
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs):
        self.kwargs = kwargs
        return iter(self.chunks)


def test_chat_sends_the_prediction_and_tools_and_reads_text_tool_calls_and_usage():
    call = SimpleNamespace(function=SimpleNamespace(name="read_file", arguments='{"path": "Lib/x.py"}'))
    details = SimpleNamespace(accepted_prediction_tokens=5, rejected_prediction_tokens=1)
    usage = SimpleNamespace(
        prompt_tokens=30, completion_tokens=9, completion_tokens_details=details, prompt_tokens_details=None
    )
    client = FakeClient([_chunk("Hi "), _chunk(calls=[call]), _chunk(finish="tool_calls"), _chunk(usage=usage)])
    request = Request("agent", "t", 1, [{"role": "user", "content": "x"}], tools=[{"type": "function"}], prediction="p")
    out = chat(client, "bench", request, Sampling(0.7, 16, 3), prediction=True, peer="specwise")
    assert client.kwargs["prediction"] == {"type": "content", "content": "p"}
    assert client.kwargs["tools"] == request.tools and client.kwargs["stream"] and client.kwargs["seed"] == 3
    assert "extra_body" not in client.kwargs  # specwise samples from the plain distribution by default
    assert out["text"] == 'Hi read_file{"path": "Lib/x.py"}' and out["completion_tokens"] == 9
    assert out["accepted_prediction_tokens"] == 5 and out["finish_reason"] == "tool_calls"
    chat(client, "bench", request, Sampling(0.7, 16, 3), prediction=False, peer="llama.cpp")
    assert "prediction" not in client.kwargs and client.kwargs["extra_body"] == {"top_k": 0, "min_p": 0.0}


# ------------------------------------------------------------------------------------------------------ runner


def test_configurations_default_to_what_can_run_and_refuse_what_cannot():
    assert [c.id for c in make_configs(None, None, False)] == [
        "specwise:none",
        "specwise:auto",
        "specwise:auto+prediction",
    ]
    everything = [c.id for c in make_configs(None, "d.gguf", True)]
    assert everything == [c for c in CONFIG_IDS if c not in ASKED_ONLY]  # self-drafting, the copies alone: when asked
    assert [c.spec for c in make_configs(["specwise:ngram"], None, False)] == ["ngram"]
    assert make_configs(["specwise:ngram+model"], "d.gguf", False)[0].spec == "ngram+model:d.gguf"
    assert [c.spec for c in make_configs(["specwise:self", "specwise:ngram+self"], None, False)] == [
        "self",
        "ngram+self",
    ]
    with pytest.raises(ValueError, match="--draft-model"):
        make_configs(["llama.cpp:draft"], None, True)
    with pytest.raises(ValueError, match="--llama-cpp"):
        make_configs(["llama.cpp:none"], None, False)
    with pytest.raises(ValueError, match="unknown configuration"):
        make_configs(["vllm"], None, True)


def test_a_specwise_configuration_may_set_its_servers_formats():
    """``@attention=…`` / ``@kv-cache=…`` after a specwise id reach its server's command line; anything else, or on a
    llama.cpp id, is refused naming what is known."""
    from specwise.lab.bench.workloads.servers import SpecwiseServer

    (config,) = make_configs(["specwise:auto@attention=bfloat16@kv-cache=float16"], None, False)
    assert (config.peer, config.spec) == ("specwise", "auto")
    assert config.server_args == ("--attention", "bfloat16", "--kv-cache", "float16")
    assert config.label == "specwise default drafter, attention bfloat16, kv-cache float16"
    server = SpecwiseServer("t.gguf", config.spec, threads=2, extra_args=config.server_args)
    server.port = 1
    assert server.command()[-4:] == ["--attention", "bfloat16", "--kv-cache", "float16"]
    assert make_configs(["specwise:none"], None, False)[0].server_args == ()
    with pytest.raises(ValueError, match="unknown server option 'attention=float16'.*@kv-cache=float32"):
        make_configs(["specwise:auto@attention=float16"], None, False)
    with pytest.raises(ValueError, match="llama.cpp's configurations take none"):
        make_configs(["llama.cpp:none@attention=bfloat16"], None, True)


def test_llama_cpp_speculative_arguments_follow_its_documented_options():
    from specwise.lab.bench.llamacpp import speculative_args

    assert speculative_args("none") == []
    assert speculative_args("ngram-mod") == ["--spec-type", "ngram-mod"]
    assert speculative_args("ngram-simple")[:2] == ["--spec-type", "ngram-simple"]
    draft = speculative_args("draft", "d.gguf")
    assert draft[:4] == ["-md", "d.gguf", "--spec-type", "draft-simple"] and "--spec-draft-n-max" in draft
    with pytest.raises(ValueError):
        speculative_args("draft")


def _fake_sender(speeds: dict[str, float], wrong: set[str] = frozenset()):
    """A sender whose decode speed is the configuration's times a drift per request; ``wrong`` configurations
    answer with other text."""
    calls = []

    def send(peer, url, request, sampling, *, prediction=False):
        calls.append((url, request.id, prediction))
        drift = 1 + 0.1 * (len(request.id) % 3)  # the machine per request: the same for every configuration
        speed = speeds[url] * drift
        text = ("other " if url in wrong else "") + request.id
        return {
            "seconds": 20 / speed + 0.5,
            "ttft_seconds": 0.5,
            "decode_seconds": 19 / speed,
            "completion_tokens": 20,
            "tokens_per_second": 20 / (20 / speed + 0.5),
            "decode_tokens_per_second": speed,
            "text": text,
            "accepted_prediction_tokens": 12 if prediction and request.prediction else None,
        }

    send.calls = calls
    return send


def _fake_run(wrong=frozenset(), rounds=2):
    configs = make_configs(
        ["specwise:none", "specwise:auto+prediction", "llama.cpp:none", "llama.cpp:ngram-mod"], None, True
    )
    speeds = {
        "specwise:none": 10.0,
        "specwise:auto+prediction": 30.0,
        "llama.cpp:none": 8.0,
        "llama.cpp:ngram-mod": 12.0,
    }
    settings = WorkloadSettings("default", ["code-edit", "agent"], configs, rounds=rounds, limit=2, warmup=False)
    sender = _fake_sender(speeds, wrong)
    results = run_workloads(
        settings, {c.id: c.id for c in configs}, command="cmd", machine={}, sender=sender, progress=False
    )
    return results, sender


def test_runner_interleaves_every_configuration_per_request_with_the_order_rotating():
    results, sender = _fake_run()
    runs = results["runs"]
    requests = len(workload_requests("code-edit", 2)) + len(workload_requests("agent", 2))
    assert len(runs) == 2 * requests * 4
    firsts = [r["config"] for r in runs if r["order"] == 0]
    assert len(set(firsts)) == 4  # every configuration goes first in turn
    # the prediction travels only with its configuration, and only where the request has one
    assert all(p == (url == "specwise:auto+prediction") for url, _, p in sender.calls)
    # an agent trace's turns go to each server in order, so its prompt cache holds the conversation so far
    agent = [(r["item_id"], r["turn"]) for r in runs if r["workload"] == "agent" and r["config"] == "specwise:none"]
    for trace in {item for item, _ in agent}:
        turns = [turn for item, turn in agent if item == trace]
        assert turns == 2 * list(range(len(turns) // 2))


def test_runner_pairs_against_own_plain_llama_cpp_plain_and_llama_cpp_best():
    results, _ = _fake_run()
    assert results["best_llama_cpp"]["code-edit"] == "llama.cpp:ngram-mod"
    paired = {(p["config"], p["workload"], p["against"], p["measure"]): p for p in results["paired"]}
    own = paired[("specwise:auto+prediction", "code-edit", "own plain", "decode_tokens_per_second")]
    assert own["geomean"] == pytest.approx(3.0) and own["verdict"] == "faster"
    best = paired[("specwise:auto+prediction", "code-edit", "llama.cpp best", "decode_tokens_per_second")]
    assert best["geomean"] == pytest.approx(30 / 12)
    assert paired[("specwise:none", "all", "llama.cpp plain", "decode_tokens_per_second")]["geomean"] == pytest.approx(
        10 / 8
    )
    summary = {(s["config"], s["workload"]): s for s in results["summary"]}
    assert summary[("specwise:auto+prediction", "code-edit")]["accepted_prediction_tokens"] == 12 * 2 * 2
    assert results["greedy_check"]["all_identical"] is True


def test_greedy_check_flags_a_specwise_output_that_differs_from_plain_and_the_report_says_so(tmp_path):
    needs_extra("bench")  # the report's plots
    results, _ = _fake_run(wrong={"specwise:auto+prediction", "llama.cpp:ngram-mod"}, rounds=1)
    check = results["greedy_check"]
    assert check["all_identical"] is False
    assert {m["config"] for m in check["mismatches"]} == {"specwise:auto+prediction"}
    assert check["llama_cpp_identical"]["identical"] == 0
    files = write_report(results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "GREEDY MISMATCH" in text and "## code-edit" in text and "## agent" in text
    assert all(f.is_file() for f in files)


def test_report_lists_failed_requests_and_leaves_them_out_of_the_figures():
    results, _ = _fake_run(rounds=1)
    results["runs"][0] = {**{k: results["runs"][0][k] for k in ("config", "peer", "workload", "category")},
                          "prompt_id": "x", "item_id": "x", "turn": 0, "seed": 0, "round": 0, "order": 0,
                          "error": "BadRequestError: 400 suffix"}  # fmt: skip
    from specwise.lab.bench.workloads.runner import summarize

    results.update(summarize(results))
    text = render_markdown(results, [])
    assert "1 requests failed" in text and "BadRequestError: 400 suffix" in text
    with pytest.raises(ValueError, match="coding-workloads"):
        check_results({"kind": "bench"})


def test_bench_cli_takes_the_workload_options_and_writes_the_command_back():
    from specwise.cli import build_parser
    from specwise.lab.bench.workloads.cli import workload_command

    argv = ["bench", "--out", "o", "--workload", "code-edit", "fim", "--limit", "1", "--max-new-tokens", "16"]
    args = build_parser().parse_args([*argv, "--configs", "specwise:none", "--llama-cpp"])
    assert args.workload == ["code-edit", "fim"] and args.configs == ["specwise:none"]
    command = workload_command(args)
    assert "--workload code-edit fim" in command and "--max-new-tokens 16" in command and "--llama-cpp" in command
    assert build_parser().parse_args(["bench", "--out", "o"]).max_new_tokens is None  # 128 outside workloads


# ------------------------------------------------------------------------------------------------------ live


def _plain_and_drafted(target: str, requests: list[Request]) -> None:
    """Each request through ``specwise serve`` on ``target``, plain and with the default drafter (the original as
    prediction), 16 tokens: measured, and the greedy answers equal."""
    from specwise.lab.bench.workloads.client import send
    from specwise.lab.bench.workloads.servers import SpecwiseServer

    sampling = Sampling(0.0, 16, 0)
    with SpecwiseServer(target, "none", threads=1) as plain, SpecwiseServer(target, "auto", threads=1) as spec:
        for request in requests:
            base = send("specwise", plain.url, request, sampling)
            out = send("specwise", spec.url, request, sampling, prediction=True)
            assert base["completion_tokens"] > 0 and out["completion_tokens"] > 0, request.id
            assert base["prompt_tokens"] > 0 and base["seconds"] > 0
            assert base["decode_tokens_per_second"] is None or base["decode_tokens_per_second"] > 0
            assert out["text"] == base["text"], request.id


@pytest.mark.slow
def test_one_request_of_each_workload_through_a_live_specwise_server():
    """The default model: a code edit, an agent turn (the answer after a file was read) and an agent tool call;
    its FIM request is refused with a 400 naming the missing FIM tokens (it has none)."""
    needs_extra("server")
    import openai

    from specwise.lab.bench.workloads.client import send
    from specwise.lab.bench.workloads.servers import SpecwiseServer

    agent = workload_requests("agent", 1)
    _plain_and_drafted("default", [workload_requests("code-edit", 1)[0], agent[1], agent[0]])
    with SpecwiseServer("default", "none", threads=1) as server, pytest.raises(openai.BadRequestError, match="fill"):
        send("specwise", server.url, workload_requests("fim", 1)[0], Sampling(0.0, 16, 0))


QWEN_FIM = Path("~/.cache/specwise/gguf/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf").expanduser()


@pytest.mark.slow
@pytest.mark.skipif(not QWEN_FIM.is_file(), reason=f"needs {QWEN_FIM} (a model with FIM tokens)")
def test_a_fim_request_through_a_live_specwise_server_on_a_code_model():
    needs_extra("server")
    _plain_and_drafted(str(QWEN_FIM), [workload_requests("fim", 1)[0]])


# ------------------------------------------------------------------------------------------------ agent traces

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
_SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to answer."}
_USER = {"role": "user", "content": "Which function does hello.py define?"}
_CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "hello.py"}'}}
_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "def greet(name):\n    return 'hello ' + name\n"}
TINY_TRACES = {  # an agent's turns as it sent them: chat completions (a tool result in the second), Responses, Messages
    "agent-chat": [
        {"route": "/v1/chat/completions", "body": {"model": "gpt-x", "stream": True, "max_tokens": 32000,
                                                   "tools": [READ_FILE], "messages": [_SYSTEM, _USER]}},
        {"route": "/v1/chat/completions", "body": {"model": "gpt-x", "stream": True, "max_completion_tokens": 4000,
                                                   "tools": [READ_FILE], "messages": [
                                                       _SYSTEM, _USER,
                                                       {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                                                       _RESULT]}},
    ],
    "agent-responses": [
        {"route": "/v1/responses", "body": {"model": "gpt-x", "stream": True, "instructions": "You are an agent.",
                                            "input": [{"role": "user", "content": "Say hi."}],
                                            "tools": [{"type": "function", "name": "read_file",
                                                       "parameters": READ_FILE["function"]["parameters"]}]}},
    ],
    "agent-messages": [
        {"route": "/v1/messages", "body": {"model": "claude-x", "stream": True, "max_tokens": 1024,
                                           "system": "You are an agent.",
                                           "messages": [{"role": "user", "content": "Say hi."}]}},
    ],
}  # fmt: skip


def write_traces(folder: Path, traces: dict = TINY_TRACES) -> Path:
    """``traces`` as recorded: a folder per trace, a file per turn (000.json, 001.json, ...)."""
    for name, turns in traces.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i, turn in enumerate(turns):
            (folder / name / f"{i:03d}.json").write_text(json.dumps(turn), encoding="utf-8")
    return folder


def test_traces_are_found_as_folders_of_turns_or_their_parent_and_checked(tmp_path):
    from specwise.lab.bench.workloads.traces import find_traces, trace_requests

    root = write_traces(tmp_path / "traces")
    assert list(find_traces([root])) == ["agent-chat", "agent-messages", "agent-responses"]  # in name order
    assert list(find_traces([root / "agent-chat"])) == ["agent-chat"]
    requests = trace_requests([root])
    assert [r.id for r in requests] == ["agent-chat#0", "agent-chat#1", "agent-messages#0", "agent-responses#0"]
    assert requests[1].route == "/v1/chat/completions" and requests[1].body == TINY_TRACES["agent-chat"][1]["body"]
    assert [r.id for r in trace_requests([root], limit=1)] == ["agent-chat#0", "agent-chat#1"]
    with pytest.raises(ValueError, match="two traces are named 'agent-chat'"):
        find_traces([root, root / "agent-chat"])
    with pytest.raises(FileNotFoundError, match="not a folder"):
        find_traces([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no trace"):
        find_traces([tmp_path / "empty"])
    bad = write_traces(tmp_path / "bad", {"t": [{"route": "/v1/embeddings", "body": {}}]})
    with pytest.raises(ValueError, match=r"t/000\.json: a recorded turn is"):
        find_traces([bad])
    (bad / "t" / "000.json").write_text('{"route": "/v1/responses", "body": {"messages": []}}')
    with pytest.raises(ValueError, match=r"000\.json: the body of a /v1/responses turn needs its 'input'"):
        find_traces([bad])


def test_a_recorded_body_is_streamed_for_the_served_model_with_its_tokens_capped():
    from specwise.lab.bench.workloads.client import recorded_body

    chat = Request("agent-traces", "t", 1, route="/v1/chat/completions", body=TINY_TRACES["agent-chat"][1]["body"])
    body = recorded_body(chat, Sampling(0.0, 64, 3), "bench", "specwise")
    assert body["model"] == "bench" and body["stream"] and body["temperature"] == 0.0 and body["seed"] == 3
    assert body["max_tokens"] == 64 and "max_completion_tokens" not in body  # the agent's 4000, capped
    assert body["stream_options"] == {"include_usage": True} and body["messages"] == chat.body["messages"]
    assert chat.body["max_completion_tokens"] == 4000  # the recorded request is left as it was
    few = Request("agent-traces", "t", 0, route="/v1/messages", body={**TINY_TRACES["agent-messages"][0]["body"]})
    few.body["max_tokens"] = 10
    assert recorded_body(few, Sampling(0.0, 64, 0), "bench", "specwise")["max_tokens"] == 10  # fewer: as asked
    responses = Request("agent-traces", "t", 0, route="/v1/responses", body=TINY_TRACES["agent-responses"][0]["body"])
    sampled = recorded_body(responses, Sampling(0.7, 64, 0), "bench", "llama.cpp")
    assert sampled["max_output_tokens"] == 64 and "max_tokens" not in sampled
    assert sampled["top_k"] == 0 and sampled["min_p"] == 0.0  # llama.cpp's sampler narrowed to specwise's


def test_each_apis_events_give_the_output_the_usage_and_the_cache():
    from specwise.lab.bench.workloads.client import _event_finish, _event_text, _event_usage

    chat = "/v1/chat/completions"
    call = {"function": {"name": "read_file", "arguments": '{"path"'}}
    assert _event_text(chat, {"choices": [{"delta": {"tool_calls": [call]}}]}) == 'read_file{"path"'
    assert _event_text(chat, {"choices": [{"delta": {"reasoning_content": "hm", "content": "A"}}]}) == "Ahm"
    usage: dict = {}
    spec = {"new_tokens": 4, "total_seconds": 1.0, "prefill_seconds": 0.5}
    _event_usage(chat, {"usage": {"prompt_tokens": 900, "completion_tokens": 4, "speculative": spec,
                                  "prompt_tokens_details": {"cached_tokens": 850}}}, usage)  # fmt: skip
    assert usage == {"prompt_tokens": 900, "completion_tokens": 4, "cached_tokens": 850, "speculative": spec}
    llama: dict = {}
    _event_usage(chat, {"usage": {"prompt_tokens": 900, "completion_tokens": 4},
                        "timings": {"cache_n": 700, "prompt_n": 200, "predicted_per_second": 9.0}}, llama)  # fmt: skip
    assert llama["cached_tokens"] == 700 and llama["timings"]["prompt_n"] == 200
    assert _event_finish(chat, {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}) == "tool_calls"

    messages, usage = "/v1/messages", {}
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 900, "cache_read_input_tokens": 0}}}
    _event_usage(messages, start, usage)
    delta = {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
             "usage": {"input_tokens": 50, "output_tokens": 7, "cache_read_input_tokens": 850}}  # fmt: skip
    _event_usage(messages, delta, usage)
    assert usage == {"prompt_tokens": 900, "completion_tokens": 7, "cached_tokens": 850}
    assert _event_finish(messages, delta) == "tool_use"
    block = {"type": "content_block_start", "content_block": {"type": "tool_use", "name": "read_file"}}
    assert _event_text(messages, block) == "read_file"
    piece = {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": '{"a"'}}
    assert _event_text(messages, piece) == '{"a"' and _event_text(messages, {"type": "ping"}) == ""

    responses, usage = "/v1/responses", {}
    assert _event_text(responses, {"type": "response.output_text.delta", "delta": "Hi"}) == "Hi"
    assert _event_text(responses, {"type": "response.function_call_arguments.delta", "delta": "{"}) == "{"
    assert _event_text(responses, {"type": "response.created", "response": {}}) == ""
    done = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 900, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 10}}},
    }
    _event_usage(responses, done, usage)  # fmt: skip
    assert usage == {"prompt_tokens": 900, "completion_tokens": 3, "cached_tokens": 10}
    assert _event_finish(responses, done) == "stop"


def _trace_sender(seconds: dict[str, float], refuse: set[tuple[str, str]] = frozenset()):
    """A sender replaying traces: a turn takes ``seconds[url]`` (per turn number + 1), ``refuse`` (url, request id)
    are answered with an error; its calls are kept."""
    calls = []

    def send(peer, url, request, sampling, *, prediction=False):
        calls.append((url, request.id, request.body is not None, sampling.max_tokens))
        if (url, request.id) in refuse:
            raise RuntimeError("/v1/responses answered 400")
        took = seconds[url] * (request.turn + 1)
        return {"seconds": took, "ttft_seconds": took / 2, "decode_seconds": took / 2, "completion_tokens": 8,
                "tokens_per_second": 8 / took, "decode_tokens_per_second": 7 / (took / 2), "text": request.id,
                "route": request.route, "prompt_tokens": 100 * (request.turn + 1), "cached_tokens": 90 * request.turn,
                "server_decode_tokens_per_second": 20.0}  # fmt: skip

    send.calls = calls
    return send


def test_agent_traces_run_turn_by_turn_and_sum_up_per_trace(tmp_path):
    needs_extra("bench")  # the report's plots
    root = write_traces(tmp_path / "traces")
    configs = make_configs(["specwise:none", "specwise:auto", "llama.cpp:none"], None, True)
    seconds = {"specwise:none": 2.0, "specwise:auto": 1.0, "llama.cpp:none": 4.0}
    sender = _trace_sender(seconds, refuse={("llama.cpp:none", "agent-responses#0")})
    settings = WorkloadSettings("t.gguf", ["agent-traces"], configs, rounds=2, traces=[str(root)])
    results = run_workloads(settings, {c.id: c.id for c in configs}, command="c", machine={}, sender=sender,
                            progress=False)  # fmt: skip
    # the warm-up is a short chat, not a trace's first turn (which would leave its prompt in the cache)
    warm = sender.calls[: len(configs)]
    assert all(call[1] == "warmup#0" and call[3] == 8 for call in warm)
    measured = [c for c in sender.calls[len(configs) :] if c[0] == "specwise:none"]
    assert [c[1] for c in measured] == 2 * ["agent-chat#0", "agent-chat#1", "agent-messages#0", "agent-responses#0"]
    assert all(c[2] and c[3] == 256 for c in measured)  # recorded bodies; 256 new tokens at most by default
    traces = {(e["config"], e["trace"]): e for e in results["traces"]}
    chat = traces[("specwise:auto", "agent-chat")]
    assert [t["turn"] for t in chat["turns"]] == [0, 1] and chat["measured_turns"] == 2
    assert chat["total_seconds"] == pytest.approx(1.0 + 2.0)
    assert [t["ttft_seconds"] for t in chat["turns"]] == [0.5, 1.0]
    assert [t["cached_tokens"] for t in chat["turns"]] == [0, 90] and chat["turns"][1]["prompt_tokens"] == 200
    assert chat["turns"][0]["route"] == "/v1/chat/completions"
    assert chat["vs_llama_cpp_plain"] == pytest.approx(0.25) and chat["shared_turns"] == 2
    refused = traces[("llama.cpp:none", "agent-responses")]
    assert refused["measured_turns"] == 0 and refused["total_seconds"] is None
    assert refused["turns"][0]["errors"] == 2 and "400" in refused["turns"][0]["error"]
    assert traces[("specwise:none", "agent-responses")]["vs_llama_cpp_plain"] is None  # no turn both served
    assert results["greedy_check"]["all_identical"] is True
    assert {r["route"] for r in results["requests"]} == {"/v1/chat/completions", "/v1/messages", "/v1/responses"}
    write_report(results, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## agent-traces: each trace" in text and "### agent-traces: each turn" in text
    assert "| agent-chat | specwise default drafter | 2/2 | 3.00 | 0.50 | 0.25x (2 turns) |" in text
    assert "| agent-chat | 1 | /v1/chat/completions | specwise plain | 200 | 90 | 2.00 | 4.00 |" in text
    assert "2 failed: RuntimeError: /v1/responses answered 400" in text


def test_bench_cli_takes_traces_with_the_agent_traces_workload_only(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="specwise bench checks its plots' extra first")
    from specwise.cli import build_parser, main
    from specwise.lab.bench.workloads.cli import workload_command

    root = write_traces(tmp_path / "traces")
    argv = ["bench", "--out", str(tmp_path / "o"), "--workload", "agent-traces", "--traces", str(root)]
    assert f"--workload agent-traces --target default --traces {root}" in workload_command(
        build_parser().parse_args(argv)
    )
    assert main(argv[:-2] + ["--target", "x.gguf"]) == 2
    assert "pass --traces DIR" in capsys.readouterr().err
    assert main(["bench", "--out", "o", "--workload", "agent", "--traces", str(root)]) == 2
    assert "--traces goes with --workload agent-traces" in capsys.readouterr().err
    assert main([*argv[:-1], str(tmp_path / "missing")]) == 2
    assert "not a folder of recorded traces" in capsys.readouterr().err


def test_the_agent_traces_script_runs_the_bench_workload():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "agent_traces.py"
    spec = importlib.util.spec_from_file_location("agent_traces", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.bench_arguments(["--target", "q.gguf", "--traces", "a", "b", "--llama-cpp", "--out", "o", "--plain"])
    assert args == ["bench", "--out", "o", "--workload", "agent-traces", "--traces", "a", "b", "--target", "q.gguf",
                    "--configs", "specwise:auto", "specwise:none", "llama.cpp:none", "--threads", "2",
                    "--max-new-tokens", "256", "--rounds", "1", "--llama-cpp"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_tool_model(tmp_path_factory):
    """A tiny random GGUF with the default model's vocabulary and Qwen2.5-Coder's chat template (tools)."""
    pytest.importorskip("gguf")
    from test_tools import QWEN_TEMPLATE, tiny_tool_gguf

    return tiny_tool_gguf(tmp_path_factory.mktemp("traces") / "qwen.gguf", QWEN_TEMPLATE)


def _llama_cpp_found() -> bool:
    from specwise.lab.bench.llamacpp import find_llama_cpp

    return find_llama_cpp() is not None


@pytest.mark.parametrize(
    "llama",
    [False, pytest.param(True, marks=pytest.mark.skipif(not _llama_cpp_found(), reason="needs llama.cpp's binaries"))],
    ids=["specwise", "with-llama-server"],
)
def test_agent_traces_through_live_servers(tiny_tool_model, tmp_path, llama):
    """The whole command on the tiny model: every recorded turn through ``specwise serve`` (plain and the default
    drafter) and, where its binaries are found, ``llama-server``: per turn its first token, time and cached tokens
    (the second turn of a conversation finds the first in the cache), per trace its total, each server's memory."""
    needs_extra("server")
    needs_extra("bench")
    from specwise.cli import main

    root = write_traces(tmp_path / "traces")
    out = tmp_path / "out"
    configs = ["specwise:none", "specwise:auto", *(["llama.cpp:none"] if llama else [])]
    argv = ["bench", "--out", str(out), "--workload", "agent-traces", "--traces", str(root), "--quiet"]
    argv += ["--target", str(tiny_tool_model), "--configs", *configs, "--max-new-tokens", "8", "--threads", "1"]
    assert main(argv + (["--llama-cpp"] if llama else [])) == 0
    results = json.loads((out / "results.json").read_text())
    assert not [r for r in results["runs"] if "error" in r]
    assert results["greedy_check"]["all_identical"] is True
    traces = {(e["config"], e["trace"]): e for e in results["traces"]}
    assert len(traces) == 3 * len(configs)
    for entry in traces.values():
        assert entry["total_seconds"] > 0 and entry["measured_turns"] == len(entry["turns"])
        for turn in entry["turns"]:
            assert turn["ttft_seconds"] > 0 and turn["seconds"] >= turn["ttft_seconds"]
            assert turn["prompt_tokens"] > 0 and turn["completion_tokens"] > 0 and turn["cached_tokens"] is not None
    for config in configs:  # the second turn reads the first from the cache
        first, second = traces[(config, "agent-chat")]["turns"]
        assert second["cached_tokens"] > first["prompt_tokens"] // 2 > 0, config
    if llama:
        assert traces[("specwise:auto", "agent-chat")]["vs_llama_cpp_plain"] > 0
    servers = results["servers"]
    assert set(servers) == set(configs) and all(s["peak_rss_mib"] > 0 for s in servers.values())
    report = (out / "report.md").read_text()
    assert "### agent-traces: each turn" in report and "## Servers' peak memory" in report
