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
from specwise.lab.bench.workloads.servers import CONFIG_IDS, make_configs


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
    assert everything == [c for c in CONFIG_IDS if "self" not in c]  # self-drafting: when asked for
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
