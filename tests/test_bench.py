"""The benchmark (results.json schema, report, plots, interleaving, greedy check) and `specwise simulate`."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest

from conftest import needs_hf, shared_data, tiny_llama
from specwise.cli import main
from specwise.lab.bench.prompts import BenchPrompt, default_prompts, load_questions, select_prompts
from specwise.lab.bench.report import PLOT_FILES, render_markdown
from specwise.lab.bench.runner import SCHEMA, BenchSettings, hf_module, make_configs, run_bench, validate_results


def needs_extra(extra: str) -> None:
    """Skip the calling test unless the modules of ``extra`` are installed (the command checks them first)."""
    import importlib.util

    from specwise.extras import EXTRAS

    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs the {extra} extra ({', '.join(missing)} not installed)")


ROOT = Path(__file__).resolve().parent.parent
SPEC_BENCH = shared_data("spec_bench/question.jsonl")  # None where the data is not on this machine
NEW_TOKENS = 10

# Made-up questions in the Spec-Bench format (never real Spec-Bench questions).
QUESTIONS = [
    {"question_id": 1, "category": "letters", "turns": ["Write a short note to a neighbour.", "Now make it formal."]},
    {"question_id": 2, "category": "letters", "turns": ["Write a thank-you card for a teacher."]},
    {"question_id": 3, "category": "arithmetic", "turns": ["What is 17 plus 25? Answer in one line."]},
    {"question_id": 4, "category": "arithmetic", "turns": ["Count from 1 to 10, separated by commas."]},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer (same vocabulary), saved as a directory."""
    needs_hf()
    from transformers import AutoTokenizer

    from specwise.models.loader import converted_gguf_dir, default_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(converted_gguf_dir(default_gguf_path()))
    path = tmp_path_factory.mktemp("tiny-smol")
    tiny_llama(seed=3, vocab=len(tokenizer), hidden=16, layers=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    path = tmp_path_factory.mktemp("questions") / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory, tiny_dir, questions):
    """One greedy run of the CLI: plain, ngram and a draft model equal to the target, with the HF baselines."""
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--out", str(out), "--target", tiny_dir, "--questions", str(questions)]
    args += ["--limit-per-category", "1", "--drafter", "none", "ngram", f"model:{tiny_dir}", "--gamma", "2"]
    args += ["--max-new-tokens", str(NEW_TOKENS), "--device", "cpu", "--quiet"]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def results(bench_dir):
    return json.loads((bench_dir / "results.json").read_text(encoding="utf-8"))


def test_results_json_matches_the_schema(results, tiny_dir):
    validate_results(results)
    ids = [c["id"] for c in results["configurations"]]
    model = f"model:{tiny_dir}"
    assert ids == [
        "specwise:none",
        "specwise:ngram:g2",
        f"specwise:{model}:g2",
        "hf_generate",
        "hf_assisted:ngram:g2",
        f"hf_assisted:{model}:g2",
    ]
    assert results["categories"] == ["letters", "arithmetic"]
    assert [p["id"] for p in results["prompts"]] == ["1", "3"]
    assert len(results["runs"]) == 2 * len(ids)
    assert all(r["new_tokens"] == NEW_TOKENS for r in results["runs"])  # fixed length: EOS not honoured
    assert len(results["summary"]) == 3 * len(ids)  # two categories and "all"
    assert results["settings"]["fixed_length"] and results["settings"]["greedy"]
    assert results["command"].startswith("specwise bench --out ")


def test_summary_statistics_and_greedy_check(results, tiny_dir):
    summary = {(s["config"], s["category"]): s for s in results["summary"]}
    plain = summary[("specwise:none", "all")]
    assert plain["speedup_vs_plain"] == pytest.approx(1.0)
    assert plain["acceptance_rate"] is None and plain["mean_accepted_length"] == pytest.approx(1.0)
    twin = summary[(f"specwise:model:{tiny_dir}:g2", "all")]  # the draft is the target: everything is accepted
    assert twin["acceptance_rate"] == pytest.approx(1.0)
    assert twin["acceptance_by_position"] == [1.0, 1.0]
    assert twin["mean_accepted_length"] > 2.0
    assert twin["stats"]["new_tokens"] == 2 * NEW_TOKENS
    peer = summary[(f"hf_assisted:model:{tiny_dir}:g2", "all")]
    assert peer["mean_accepted_length"] > 1.5 and peer["acceptance_rate"] is None
    assert summary[("hf_generate", "all")]["speedup_vs_hf_generate"] == pytest.approx(1.0)
    check = results["greedy_check"]
    assert check["greedy"] and check["all_identical"] and check["checked_runs"] == 2 * 2
    assert check["hf_generate_identical"]["total"] == 2 and check["hf_assisted_identical"]["total"] == 4
    assert all(s["greedy_identical"] for s in results["summary"] if s["config"].startswith("specwise:model"))


def test_runs_are_interleaved_in_rotated_order(results):
    ids = [c["id"] for c in results["configurations"]]
    for j, prompt in enumerate(results["prompts"]):
        runs = sorted((r for r in results["runs"] if r["prompt_id"] == prompt["id"]), key=lambda r: r["order"])
        assert [r["order"] for r in runs] == list(range(len(ids)))
        assert [r["config"] for r in runs] == ids[j:] + ids[:j]


def test_report_and_plots(bench_dir, results):
    report = (bench_dir / "report.md").read_text(encoding="utf-8")
    assert results["command"] in report
    assert "**Greedy check passed:**" in report
    assert "| configuration | tokens/s | speedup vs plain | speedup vs HF |" in report
    for config in results["configurations"]:
        assert config["label"] in report
    assert "| configuration | letters | arithmetic | all |" in report
    assert "## Acceptance by draft position" in report
    for name in PLOT_FILES.values():
        data = (bench_dir / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"]({name})" in report


def test_machine_names_the_cpu_generation_and_kernel_path(results, monkeypatch):
    import specwise.lab.bench.runner as runner

    machine = results["machine"]
    assert "cpu_generation" in machine and "kernel_isa" in machine
    import specwise.machine as machine

    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n\n"
    monkeypatch.setattr(machine, "cpuinfo", lambda: machine.parse_cpuinfo(cpuinfo))
    assert runner.machine_info("cpu")["cpu_generation"] == "AuthenticAMD family 26 model 2"
    shown = copy.deepcopy(results)
    shown["machine"].update(cpu_generation="AuthenticAMD family 26 model 2", kernel_isa="avx512")
    assert "(AuthenticAMD family 26 model 2; avx512 kernels)" in render_markdown(shown)


def test_report_only_rerenders_and_a_mismatch_is_loud(tmp_path, results, capsys):
    bad = copy.deepcopy(results)
    run = next(r for r in bad["runs"] if r["config"] == "specwise:ngram:g2")
    bad["greedy_check"]["all_identical"] = False
    bad["greedy_check"]["mismatches"] = [
        {"config": run["config"], "prompt_id": run["prompt_id"], "seed": 0, "first_difference": 3}
    ]
    (tmp_path / "results.json").write_text(json.dumps(bad), encoding="utf-8")
    code = main(["bench", "--out", str(tmp_path), "--report-only"])
    captured = capsys.readouterr()
    assert code == 1
    assert "GREEDY MISMATCH" in captured.err and "GREEDY MISMATCH" in captured.out
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "⚠ GREEDY MISMATCH: 1 of 4" in report and "first difference at token 3" in report
    assert all((tmp_path / name).stat().st_size > 0 for name in PLOT_FILES.values())


def test_report_only_recomputes_the_paired_speedups_from_the_runs(tmp_path, results):
    old = copy.deepcopy(results)
    old["paired"] = [e for e in old["paired"] if e["measure"] != "decode_tokens_per_second"]  # an older run's
    (tmp_path / "results.json").write_text(json.dumps(old), encoding="utf-8")
    assert main(["bench", "--out", str(tmp_path), "--report-only"]) == 0
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "by category (decode tokens per second: the prompt's pass left out)" in report
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8")) == old  # the runs' file untouched


def test_validator_names_every_problem(results):
    bad = copy.deepcopy(results)
    del bad["runs"][0]["tokens_per_second"]
    bad["summary"][0]["runs"] = "three"
    bad["runs"][1]["config"] = "specwise:bogus"
    bad["summary"] = [s for s in bad["summary"] if not (s["config"] == "hf_generate" and s["category"] == "all")]
    with pytest.raises(ValueError) as err:
        validate_results(bad)
    message = str(err.value)
    assert "runs[0]: missing field 'tokens_per_second'" in message
    assert "summary[0].runs: expected int, got str" in message
    assert "unknown configuration 'specwise:bogus'" in message
    assert "no entry for 'hf_generate' in category 'all'" in message
    with pytest.raises(ValueError, match="missing field 'greedy_check'"):
        validate_results({k: v for k, v in results.items() if k != "greedy_check"})


def test_every_schema_field_is_documented():
    from specwise.lab.bench.schema import OPTIONAL

    docs = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`([a-z_]+)`", docs))
    schemas = [*SCHEMA.items(), *OPTIONAL.items()]
    missing = {f"{kind}.{name}" for kind, fields in schemas for name in fields if name not in documented}
    assert not missing, f"fields missing from docs/BENCHMARKS.md: {sorted(missing)}"


def test_library_run_with_sampling_and_default_prompts(tiny_dir):
    from specwise.models import load_model

    prompts = select_prompts(default_prompts(), ["summarization", "coding"], None)
    settings = BenchSettings(drafters=["ngram"], gammas=[3], max_new_tokens=6, temperature=0.8, top_p=0.9, seeds=[1, 2])
    settings.hf_baselines, settings.stop_at_eos, settings.warmup = False, True, False
    data = run_bench(settings, prompts, loaded=load_model(tiny_dir), progress=False)
    validate_results(data)
    assert [c["id"] for c in data["configurations"]] == ["specwise:none", "specwise:ngram:g3"]
    assert len(data["runs"]) == 2 * 2 * 2
    assert {(r["prompt_id"], r["seed"]) for r in data["runs"]} == {
        (p, s) for p in ("own-summary", "own-coding") for s in (1, 2)
    }
    assert all(r["identical_to_plain"] is None for r in data["runs"])
    assert data["greedy_check"]["all_identical"] is None and not data["settings"]["fixed_length"]
    text = render_markdown(data)
    assert "Sampled decoding" in text and "speedup vs HF" not in text


def test_configurations():
    ids = [c.id for c in make_configs(["ngram:2", "none", "ngram:2", "model:d"], [4, 2, 4], hf_baselines=True)]
    assert ids == [
        "specwise:none",
        "specwise:ngram:2:g4",
        "specwise:ngram:2:g2",
        "specwise:model:d:g4",
        "specwise:model:d:g2",
        "hf_generate",
        "hf_assisted:ngram:2:g4",
        "hf_assisted:ngram:2:g2",
        "hf_assisted:model:d:g4",
        "hf_assisted:model:d:g2",
    ]
    assert [c.id for c in make_configs(["none"], [4], hf_baselines=False)] == ["specwise:none"]
    assert [c.label for c in make_configs(["model:/a/b/"], [4], False)] == ["specwise plain", "specwise model:b γ=4"]


def test_hf_baselines_need_a_hugging_face_model():
    from specwise.extras import MissingExtraError
    from specwise.models.toy import ToyModel

    # without the hf extra, the extra is named first
    with pytest.raises((ValueError, MissingExtraError), match="--no-hf"):
        hf_module(ToyModel.random(4), "target")


def test_questions_and_prompt_selection(questions, tmp_path):
    prompts = load_questions(questions)
    assert prompts[0] == BenchPrompt("1", "letters", "Write a short note to a neighbour.")  # first turn only
    assert [p.id for p in select_prompts(prompts, ["arithmetic", "letters"], 1)] == ["3", "1"]
    assert [p.id for p in select_prompts(prompts, None, None)] == ["1", "2", "3", "4"]
    with pytest.raises(ValueError, match="unknown categories \\['poetry'\\]"):
        select_prompts(prompts, ["poetry"], None)
    with pytest.raises(ValueError, match=">= 1"):
        select_prompts(prompts, None, 0)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question_id": 1, "category": "x", "turns": []}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.jsonl:1: not a Spec-Bench question"):
        load_questions(broken)


def test_default_prompts_are_our_own():
    prompts = default_prompts()
    assert len({p.id for p in prompts}) == len(prompts) >= 5
    assert len({p.category for p in prompts}) == len(prompts)
    if SPEC_BENCH is not None:
        spec_bench = SPEC_BENCH.read_text(encoding="utf-8")
        assert not any(p.text[:60] in spec_bench for p in prompts)


def test_the_shipped_prompts_hold_no_spec_bench_question():
    """The prompts `distill` and `index` fall back to must not teach a drafter the benchmark's questions."""
    if SPEC_BENCH is None:
        pytest.skip("no Spec-Bench questions on this machine: set $SPECWISE_TEST_DATA to a folder holding spec_bench/")
    from specwise.lab.answers import SHIPPED_PROMPTS

    turns = {
        t.strip()[:80]
        for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines()
        for t in json.loads(line)["turns"]
    }
    shipped = [
        json.loads(line)["prompt"].strip()[:80]
        for path in sorted(SHIPPED_PROMPTS.glob("*.prompts.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    assert len(shipped) >= 100 and not turns & set(shipped)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--categories", "poetry"], "unknown categories"),
        (["--gamma", "0"], "--gamma values must be >= 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--report-only"], "results.json not found"),
    ],
)
def test_bench_argument_errors(tmp_path, capsys, flags, message):
    needs_extra("bench")
    code = main(["bench", "--out", str(tmp_path / "out"), "--target", "/no/such/model", "--quiet", *flags])
    assert code == 2
    assert message in capsys.readouterr().err


def test_bench_gamma_is_an_integer_or_auto(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--out", "unused", "--gamma", "four"])
    assert "expected an integer or auto, got 'four'" in capsys.readouterr().err


def test_simulate_writes_the_theory_and_the_exactness_plot(tmp_path, capsys):
    needs_extra("bench")
    code = main(["simulate", "--out", str(tmp_path), "--samples", "400", "--gammas", "1", "4", "--alphas", "0.8"])
    out = capsys.readouterr().out
    assert code == 0
    assert "TV(emitted, p)" in out and "E[tau] at alpha=0.80: gamma=1: 1.80, gamma=4: 3.36" in out
    for name in ("tau_vs_alpha.png", "speedup_vs_cost.png", "exactness.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
    data = json.loads((tmp_path / "simulate.json").read_text(encoding="utf-8"))
    taus = data["tau_vs_alpha"]["tau"]["4"]
    assert taus[0] == pytest.approx(1.0) and all(a < b for a, b in zip(taus, taus[1:]))
    assert data["speedup_vs_cost"]["speedup"]["0.8"][0] == pytest.approx(taus[80])
    exp = data["exactness"]
    assert sum(exp["p"]) == pytest.approx(1.0) and sum(exp["emitted"]) == pytest.approx(1.0)
    assert exp["tv_q_vs_p"] > 0.5  # the draft is far from the target ...
    assert exp["tv_emitted_vs_p"] < 0.2  # ... yet what is emitted follows p (sampling noise only)


def test_simulate_exactness_experiment_without_the_plots():
    """The experiment itself is numpy (the core install): emitted sequences follow p, the same on every run."""
    from specwise.lab.bench.simulate import SimulateSettings, exactness_experiment

    settings = SimulateSettings(samples=400)
    exp = exactness_experiment(settings)
    assert sum(exp["p"]) == pytest.approx(1.0) and sum(exp["emitted"]) == pytest.approx(1.0)
    assert exp["tv_q_vs_p"] > 0.5 and exp["tv_emitted_vs_p"] < 0.2 and exp["tv_iid_sample_vs_p"] < 0.2
    assert exactness_experiment(settings) == exp  # seeded: the same runs


def test_simulate_rejects_bad_settings(tmp_path, capsys):
    needs_extra("bench")
    assert main(["simulate", "--out", str(tmp_path), "--alphas", "1.0"]) == 2
    assert "alphas must be in [0, 1)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ peak memory


def _peak_measurable() -> bool:
    from specwise.lab.bench.memory import PeakMemory

    return PeakMemory().available


@pytest.mark.skipif(not _peak_measurable(), reason="needs Linux's /proc/self/status and clear_refs")
def test_every_run_and_configuration_reports_its_peak_memory(results, bench_dir):
    assert results["memory"]["available"] and results["memory"]["reason"] is None
    assert all(r["peak_rss_mib"] > 0 for r in results["runs"])
    for entry in results["summary"]:  # a configuration's peak: the highest of its runs'
        runs = [
            r["peak_rss_mib"]
            for r in results["runs"]
            if r["config"] == entry["config"] and entry["category"] in ("all", r["category"])
        ]
        assert entry["peak_rss_mib"] == max(runs) > 0
    report = (bench_dir / "report.md").read_text(encoding="utf-8")
    assert "| peak MiB |" in report and "peak resident memory while the configuration's runs ran" in report


def test_peak_memory_follows_what_the_process_holds():
    from specwise.lab.bench.memory import PeakMemory, process_peak_mib

    memory = PeakMemory()
    if not memory.available:
        pytest.skip(memory.reason)
    before = memory.peak_mib()
    block = bytearray(64 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    assert memory.peak_mib() >= before + 60
    del block
    memory.reset()  # the peak falls back to what is resident now
    assert memory.peak_mib() < before + 30
    import os

    assert process_peak_mib(os.getpid())[0] > 0
    assert process_peak_mib(None) == (None, "the process is not running")


def test_peak_memory_is_null_with_its_reason_where_it_cannot_be_read(tmp_path):
    from specwise.lab.bench.memory import PeakMemory, process_peak_mib

    elsewhere = PeakMemory(status=tmp_path / "status")  # no /proc: not Linux
    assert not elsewhere.available and elsewhere.peak_mib() is None and "Linux only" in elsewhere.reason
    elsewhere.reset()  # nothing to reset, nothing raised
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\n")
    sealed = PeakMemory(status=status, clear_refs=tmp_path / "no-such-dir" / "clear_refs")  # a sandbox
    assert sealed.peak_mib() is None and "cannot reset the peak" in sealed.reason
    assert sealed.record() == {"measure": sealed.record()["measure"], "available": False, "reason": sealed.reason}
    assert PeakMemory(status=status, clear_refs=tmp_path / "clear_refs").peak_mib() == 2.0
    value, reason = process_peak_mib(2**22 + 12345)
    assert value is None and "Linux only" in reason


def test_a_run_without_peak_memory_reports_null_and_says_why(tiny_dir, monkeypatch, tmp_path):
    import specwise.lab.bench.runner as runner
    from specwise.lab.bench.memory import PeakMemory
    from specwise.models import load_model

    monkeypatch.setattr(runner, "PeakMemory", lambda: PeakMemory(status=tmp_path / "missing"))
    prompts = select_prompts(default_prompts(), ["coding"], None)
    settings = BenchSettings(drafters=["ngram"], gammas=[2], max_new_tokens=4)
    settings.hf_baselines, settings.warmup = False, False
    data = run_bench(settings, prompts, loaded=load_model(tiny_dir), progress=False)
    validate_results(data)
    assert data["memory"]["available"] is False and "Linux only" in data["memory"]["reason"]
    assert all(r["peak_rss_mib"] is None for r in data["runs"])
    assert all(s["peak_rss_mib"] is None for s in data["summary"])
    assert "Peak memory was not measured: no peak resident memory to read" in render_markdown(data)
    older = copy.deepcopy(data)  # results written before peak memory was measured still validate
    del older["memory"]
    for item in (*older["runs"], *older["summary"]):
        del item["peak_rss_mib"]
    validate_results(older)
    assert "peak MiB" not in render_markdown(older)
    older["runs"][0]["peak_rss_mib"] = "a lot"
    with pytest.raises(ValueError, match=r"runs\[0\]\.peak_rss_mib: expected int or float or null, got str"):
        validate_results(older)


# ------------------------------------------------------------------------------------ rounds and paired speedups


@pytest.fixture(scope="module")
def rounds_results(tiny_dir, questions):
    """Two rounds of plain, ngram at a fixed gamma and at gamma auto, on one question of each category."""
    from specwise.models import load_model

    prompts = select_prompts(load_questions(questions), None, 1)
    settings = BenchSettings(drafters=["ngram"], gammas=[2, "auto"], max_new_tokens=6, rounds=2)
    settings.hf_baselines, settings.warmup = False, False
    return run_bench(settings, prompts, loaded=load_model(tiny_dir), progress=False)


def test_rounds_rotate_the_order_of_every_prompt(rounds_results):
    data = rounds_results
    validate_results(data)
    ids = [c["id"] for c in data["configurations"]]
    assert ids == ["specwise:none", "specwise:ngram:g2", "specwise:ngram:gauto"]
    assert data["settings"]["rounds"] == 2
    assert len(data["runs"]) == 2 * 2 * len(ids)  # rounds x prompts x configurations
    for r in range(2):
        for j, prompt in enumerate(data["prompts"]):
            runs = [x for x in data["runs"] if x["round"] == r and x["prompt_id"] == prompt["id"]]
            runs.sort(key=lambda x: x["order"])
            shift = (r + j) % len(ids)
            assert [x["config"] for x in runs] == ids[shift:] + ids[:shift]
    assert all(x["identical_to_plain"] for x in data["runs"] if x["config"] != "specwise:none")
    assert all(x["decode_tokens_per_second"] > 0 for x in data["runs"])


def test_paired_entries_of_a_run(rounds_results):
    from specwise.lab.bench.paired import FASTER, NO_DIFFERENCE, SLOWER

    data = rounds_results
    paired = {(e["config"], e["baseline"], e["measure"], e["category"]): e for e in data["paired"]}
    measures = ("tokens_per_second", "decode_tokens_per_second")  # end to end, and the prompt's pass left out
    assert set(paired) == {
        (c, "specwise:none", m, cat)
        for c in ("specwise:ngram:g2", "specwise:ngram:gauto")
        for m in measures
        for cat in ("letters", "arithmetic", "all")
    }
    for e in paired.values():
        assert e["verdict"] in (FASTER, SLOWER, NO_DIFFERENCE)
        assert e["pairs"] == 2 * e["questions"]  # one pair per question and round
    one = paired[("specwise:ngram:g2", "specwise:none", "tokens_per_second", "letters")]
    assert one["questions"] == 1 and one["low"] is None and one["verdict"] == NO_DIFFERENCE
    assert paired[("specwise:ngram:g2", "specwise:none", "tokens_per_second", "all")]["questions"] == 2
    # the decode measure pairs the runs' decode rates: its ratio is the geometric mean of theirs
    runs = {(r["config"], r["prompt_id"], r["round"]): r for r in data["runs"]}
    ratios = [
        runs[("specwise:ngram:g2", r["prompt_id"], r["round"])]["decode_tokens_per_second"]
        / r["decode_tokens_per_second"]
        for r in data["runs"]
        if r["config"] == "specwise:none"
    ]
    expected = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    decode = paired[("specwise:ngram:g2", "specwise:none", "decode_tokens_per_second", "all")]
    assert decode["geomean"] == pytest.approx(expected, rel=1e-6)
    text = render_markdown(data)
    assert "## Paired speedups (all categories)" in text and "paired speedup [95%]" in text
    assert "## Paired speedup over plain decoding of the same engine, by category\n" in text
    assert "by category (decode tokens per second: the prompt's pass left out)" in text
    assert "specwise ngram γ=auto" in text


def test_report_of_rounds_with_gamma_auto(rounds_results, tmp_path):
    from specwise.lab.bench.report import write_report

    files = write_report(rounds_results, tmp_path)
    assert [f.name for f in files] == ["report.md", *PLOT_FILES.values()]
    assert all(f.stat().st_size > 0 for f in files)


def test_t_quantile_on_fixed_inputs():
    from specwise.lab.bench.paired import t_quantile

    for dof, value in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452), (120, 1.9799)):
        assert t_quantile(0.975, dof) == pytest.approx(value, abs=1e-4)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.975, 0)


def test_geometric_interval_and_verdicts_on_fixed_inputs():
    import math

    from specwise.lab.bench.paired import FASTER, NO_DIFFERENCE, SLOWER, geometric_interval, verdict

    out = geometric_interval([1.1, 1.2, 1.15, 1.05])
    logs = [math.log(r) for r in (1.1, 1.2, 1.15, 1.05)]
    mean = sum(logs) / 4
    half = 3.182446 * math.sqrt(sum((x - mean) ** 2 for x in logs) / 3) / 2
    assert out["n"] == 4 and out["geomean"] == pytest.approx(math.exp(mean))
    assert out["low"] == pytest.approx(math.exp(mean - half), rel=1e-6)
    assert out["high"] == pytest.approx(math.exp(mean + half), rel=1e-6)
    assert out["verdict"] == FASTER
    assert geometric_interval([0.8, 0.85, 0.9])["verdict"] == SLOWER
    assert geometric_interval([0.9, 1.1, 1.0])["verdict"] == NO_DIFFERENCE
    single = geometric_interval([2.0])
    assert single["geomean"] == pytest.approx(2.0) and single["low"] is None and single["verdict"] == NO_DIFFERENCE
    assert geometric_interval([])["geomean"] is None
    assert verdict(1.01, 1.2) == FASTER and verdict(0.5, 0.99) == SLOWER and verdict(0.9, 1.1) == NO_DIFFERENCE
    assert verdict(None, None) == NO_DIFFERENCE


def test_paired_speedups_pair_by_question_and_round():
    import math

    from specwise.lab.bench.paired import paired_speedups

    def run(config, prompt, category, rnd, tps, seed=0):
        return {"config": config, "prompt_id": prompt, "category": category, "seed": seed, "round": rnd,
                "tokens_per_second": tps}  # fmt: skip

    runs = [
        run("base", "a", "x", 0, 10.0), run("m", "a", "x", 0, 20.0),  # a: ratios 2 and 8 -> 4 (geometric mean)
        run("base", "a", "x", 1, 10.0), run("m", "a", "x", 1, 80.0),
        run("base", "b", "y", 0, 10.0), run("m", "b", "y", 0, 10.0),  # b: 1
        run("m", "c", "y", 0, 99.0),  # no baseline run: not a pair
    ]  # fmt: skip
    entries = {e["category"]: e for e in paired_speedups(runs, "m", "base", ["x", "y"])}
    assert entries["x"]["geomean"] == pytest.approx(4.0) and entries["x"]["pairs"] == 2
    assert entries["x"]["questions"] == 1 and entries["x"]["low"] is None
    assert entries["y"]["geomean"] == pytest.approx(1.0) and entries["y"]["questions"] == 1
    both = entries["all"]
    assert both["questions"] == 2 and both["pairs"] == 3 and both["geomean"] == pytest.approx(2.0)
    half = 12.706205 * math.log(4.0) / math.sqrt(2) / math.sqrt(2)  # t(1) * stdev([log 4, 0]) / sqrt(2)
    assert both["low"] == pytest.approx(math.exp(math.log(2.0) - half), rel=1e-5)
    assert both["verdict"] == "no measurable difference" and both["baseline"] == "base"


def test_bench_command_spells_out_rounds_and_gamma_auto():
    import argparse

    from specwise.lab.bench.cli import bench_command

    args = argparse.Namespace(
        out="o", questions=None, categories=None, limit_per_category=None, target="default", drafter=["ngram"],
        gamma=[4, "auto"], max_new_tokens=8, temperature=0.0, seeds=[0], rounds=3, device="cpu", threads=2,
        precision="exact", llama_cpp="", no_hf=True, stop_at_eos=False, no_chat=False, no_warmup=False,
    )  # fmt: skip
    command = bench_command(args)
    assert "--gamma 4 auto" in command and "--rounds 3" in command and "--precision exact" in command
    assert command.endswith("--llama-cpp --no-hf")


def test_interleave_categories_takes_one_of_each_in_turn():
    from specwise.lab.bench.prompts import BenchPrompt, interleave_categories

    ps = [BenchPrompt(f"{c}{i}", c, "t") for c, n in (("a", 3), ("b", 1), ("c", 2)) for i in range(n)]
    assert [p.id for p in interleave_categories(ps)] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert interleave_categories([]) == []
