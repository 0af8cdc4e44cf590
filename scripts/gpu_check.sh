#!/usr/bin/env bash
# The checks that need a CUDA GPU, in order of importance:
#   tests       the CUDA tests (tests/test_cuda.py: models, greedy identity, sampled distributions, distill)
#   cuda_check  the default model on CUDA against the CPU's reference outputs, with every drafter
#   profile     the cost curve c(k) on CUDA (`specwise profile --device cuda`)
#   speed       the engine's speed on CUDA, greedy (2 questions per category) and temperature 1
#
# Usage: scripts/gpu_check.sh OUT_DIR [QUESTIONS]   (STAGES="tests cuda_check" runs only those; PER_CATEGORY=1
# times one question per category instead of two)
# QUESTIONS (else $SPECWISE_QUESTIONS) is Spec-Bench's question.jsonl (data/spec_bench/question.jsonl of
# github.com/hemingkx/Spec-Bench): cuda_check compares against CPU outputs made from it and is skipped without it;
# speed then runs on specwise bench's own prompts.
# Needs the project importable (its virtual environment, or PYTHONPATH) and the default model's package.
# Every stage runs even when an earlier one fails; the exit status is 1 if any failed.
set -u
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [QUESTIONS]}
questions=${2:-${SPECWISE_QUESTIONS:-}}
stages=${STAGES:-tests cuda_check profile speed}
per_category=${PER_CATEGORY:-2}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0

stage() {  # stage NAME COMMAND...: run it when NAME is selected, timing it and noting a failure
    local name=$1
    shift
    case " $stages " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name: $*"
    local t0=$SECONDS
    "$@" || { echo "!! $name failed"; status=1; }
    echo "== $name took $((SECONDS - t0)) s"
}

profile() {
    $py -m specwise profile --device cuda --json >"$out/profile_cuda.json" && cat "$out/profile_cuda.json"
}

"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
stage tests "$py" -m pytest -q -p no:cacheprovider tests/test_cuda.py
if [ -n "$questions" ]; then
    stage cuda_check "$py" benchmarks/cuda_check.py --device cuda --questions "$questions" \
        --reference benchmarks/results/cpu_reference.json --out "$out/cuda_check.json"
    greedy=(--questions "$questions" --limit-per-category "$per_category")
    sampled=(--questions "$questions" --limit-per-category 1)
else
    echo "== cuda_check skipped: pass Spec-Bench's question.jsonl as QUESTIONS (or set SPECWISE_QUESTIONS)"
    greedy=()
    sampled=()
fi
stage profile profile
stage speed "$py" -m specwise bench --device cuda "${greedy[@]}" \
    --max-new-tokens 128 --drafter ngram head ngram+head --gamma 4 auto --quiet --out "$out/cuda_speed_greedy"
stage speed "$py" -m specwise bench --device cuda "${sampled[@]}" \
    --max-new-tokens 128 --temperature 1 --no-hf --drafter ngram head ngram+head --gamma auto --quiet \
    --out "$out/cuda_speed_t1"
exit $status
