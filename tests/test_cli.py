"""The command line: JSON output, streaming, argument errors, vocabulary mismatch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import tiny_llama
from specwise.cli import main

STATS_FIELDS = {
    "target_passes",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_by_position",
    "tokens_per_second",
    "draft_seconds",
    "verify_seconds",
}


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-other")
    tiny_llama(seed=4, vocab=500, hidden=16, layers=1).save_pretrained(path)
    return str(path)


def run_json(capsys, *args):
    code = main(["generate", *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def test_json_has_every_field_and_drafters_agree(capsys, tiny_dir):
    base = ["Say something.", "--target", tiny_dir, "--temperature", "0", "--max-new-tokens", "20"]
    plain = run_json(capsys, *base, "--drafter", "none")
    assert set(plain) == {"text", "token_ids", "finish_reason", "stats"}
    assert set(plain["stats"]) >= STATS_FIELDS
    assert plain["finish_reason"] in {"stop", "length"}
    for drafter in ["ngram", f"model:{tiny_dir}"]:
        spec = run_json(capsys, *base, "--drafter", drafter, "--gamma", "3")
        assert spec["token_ids"] == plain["token_ids"]
        assert spec["text"] == plain["text"]


def test_streaming_prints_text_then_statistics(capsys, tiny_dir):
    code = main(["generate", "Hello", "--target", tiny_dir, "--max-new-tokens", "8", "--no-chat", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tokens/s" in out and "alpha" in out and "acceptance by position" in out


def test_stop_string_and_sampling_flags(capsys, tiny_dir):
    args = ["Hello", "--target", tiny_dir, "--max-new-tokens", "30", "--temperature", "0.8", "--top-k", "50"]
    args += ["--top-p", "0.9", "--min-p", "0.05", "--seed", "7", "--no-chat"]
    a = run_json(capsys, *args)
    b = run_json(capsys, *args)
    assert a["token_ids"] == b["token_ids"]  # seeded runs repeat
    if len(a["text"]) > 6:
        stop = a["text"][3:6]
        c = run_json(capsys, *args, "--stop", stop)
        assert stop not in c["text"] and a["text"].startswith(c["text"])
        assert c["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--min-p", "1"], "min_p must be in [0, 1)"),
        (["--top-k", "-2"], "top_k must be >= 0"),
        (["--gamma", "-1"], "argument --gamma: must be >= 0"),
        (["--gamma", "lots"], "argument --gamma: must be an integer >= 0 or auto"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--drafter", "bogus"], "unknown drafter"),
        (["--target", "/no/such/model"], "not found"),
        (["--device", "cuda:7"], "cuda"),
    ],
)
def test_bad_arguments_exit_nonzero_with_a_clear_message(capsys, tiny_dir, flags, message):
    args = ["generate", "hi", "--target", tiny_dir, *flags]
    if "--target" in flags:
        args = ["generate", "hi", *flags]
    if flags[0] == "--device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA present")
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse rejects badly typed values itself
        code = exit_.code
    captured = capsys.readouterr()
    assert code != 0
    assert message in captured.err
    assert captured.out == ""


def test_vocabulary_mismatch_fails_before_generating(capsys, tiny_dir, other_vocab_dir):
    code = main(["generate", "hi", "--target", tiny_dir, "--drafter", f"model:{other_vocab_dir}", "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert "draft vocabulary (500) differs from target's (49152)" in captured.err
    assert captured.out == ""


def test_console_script_reports_errors_on_stderr():
    proc = subprocess.run(
        [sys.executable, "-m", "specwise.cli", "generate", "hi", "--temperature", "-0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "temperature must be >= 0" in proc.stderr
