#!/usr/bin/env bash
# One prepared GPU check: every benchmark at GPU sizes inside ~8 minutes (the Magpie TTS one included), then
# `pytest -m gpu` (CUDA graphs, CUDA-graph decoder, the fast Magpie step on CUDA).
#
#   bash scripts/gpu_check.sh                 # on a CUDA machine; results in $OUT if set, else bench_out/gpu
#   GPU_CHECK_DRY=1 bash scripts/gpu_check.sh # rehearsal on a CPU machine: same steps, tiny sizes
#
# Assumes torch with CUDA is already installed (installs nothing heavy; NeMo/Pipecat only if missing). Each step
# runs under its own time limit and is skipped when the total budget (GPU_CHECK_BUDGET_S, default 470 s) is
# spent; the soak, which runs last, is shortened to fit. A step that fails or times out is logged and the script
# goes on. Random-weight models are built once into MODELS_DIR (default bench_out/models), never into the output.
set -u
cd "$(dirname "$0")/.."

OUT_DIR="${OUT:-bench_out/gpu}"
MODELS_DIR="${MODELS_DIR:-bench_out/models}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"
PY="${PYTHON:-python}"
DRY="${GPU_CHECK_DRY:-0}"
mkdir -p "$OUT_DIR" "$MODELS_DIR"
LOG="$OUT_DIR/gpu_check.log"
START=$(date +%s)
export PYTHONUNBUFFERED=1

if [[ "$DRY" == "1" ]]; then
  # CPU rehearsal of this script: the same steps with tiny sizes.
  MODEL=tiny-random DEVICE=cpu BUILD_MODEL=tiny-random
  BUF_ARGS=(--latency 160 --streams 1 2 --max-audio-s 3)
  TTF_ARGS=(--lengths 1 5 --repeats 1 --short-repeats 2)
  CONC_ARGS=(--streams 1 2 --seconds 2 --step-batches 1 4 --step-modes 160 --step-seconds 1)
  STEP_ARGS=(--modes 160 --batches 1 4 --repeats 2)
  TTS_ARGS=(--large small --large-frames 10 --tiny-frames 10 --tiny-counts 1 2)
  TTS_BF16_ARGS=(--large small --large-frames 10 --no-tiny)
  GREEDY_ARGS=(--shape small --frames 8)
  SOAK_STREAMS=2 SOAK_MAX_MIN=0.3
else
  MODEL=600m DEVICE=cuda BUILD_MODEL=600m
  BUF_ARGS=(--latency 160 560 --streams 1 16 --max-audio-s-600m 10)
  TTF_ARGS=(--lengths 1 5 20 60 --repeats 2 --short-repeats 8)
  CONC_ARGS=(--streams 1 128 512 768 --seconds 5 --step-batches 1 4 16 64 --step-seconds 2)
  STEP_ARGS=(--modes 160 560 --batches 1 4 16 64 --repeats 5)
  TTS_ARGS=(--large 357m --large-frames 60 --tiny-frames 43 --tiny-counts 1 4 16)
  TTS_BF16_ARGS=(--large 357m --large-frames 60 --no-tiny)
  GREEDY_ARGS=(--shape 357m --frames 12 --threads 8)
  SOAK_STREAMS=127 SOAK_MAX_MIN=3
fi

log() { echo "[gpu_check $(($(date +%s) - START))s] $*" | tee -a "$LOG"; }

# step NAME LIMIT_S COMMAND...: run COMMAND under min(LIMIT_S, budget left), logging its exit status.
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if ((left < 20)); then
    log "SKIP $name: only ${left}s of the budget left"
    echo "$name skipped" >>"$OUT_DIR/status.txt"
    return 0
  fi
  ((limit > left)) && limit=$left
  log "RUN $name (limit ${limit}s): $*"
  timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  log "END $name rc=$rc"
  echo "$name rc=$rc" >>"$OUT_DIR/status.txt"
}

: >"$OUT_DIR/status.txt"
log "output: $OUT_DIR; models: $MODELS_DIR; budget ${BUDGET_S}s; dry=$DRY"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"

if ! "$PY" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('pipecat_nemotron', 'nemo', 'pipecat')))"; then
  log "installing the package (pip install -e ., --no-deps fallback)"
  "$PY" -m pip install -q -e . 2>&1 | tail -3 | tee -a "$LOG" || "$PY" -m pip install -q --no-deps -e . 2>&1 | tail -3 | tee -a "$LOG"
fi
if [[ "$DRY" != "1" ]]; then
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print('torch', torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee -a "$LOG"
  if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
    log "CUDA not available: stopping (GPU_CHECK_DRY=1 rehearses on CPU)"
    exit 1
  fi
fi

BENCH=("$PY" -m pipecat_nemotron.bench)
COMMON=(--out "$OUT_DIR" --models-dir "$MODELS_DIR" --device "$DEVICE")

# 1. The model: the 600M architecture with random weights (~1 min to build; cached in MODELS_DIR).
step build-model 120 "$PY" -c "
from pathlib import Path
from pipecat_nemotron.bench.common import resolve_model
print(resolve_model('$BUILD_MODEL', Path('$MODELS_DIR')))"

# 2. Our encoder step vs NeMo's (bf16 on CUDA; CUDA graphs are exercised by the engine benchmarks below).
step encoder-step 45 "${BENCH[@]}" encoder-step "${COMMON[@]}" --model "$MODEL" "${STEP_ARGS[@]}"

# 3. Cache-aware (our step and NeMo's) vs NeMo's buffered pipeline at matched latency (BRIEF: ~3x over buffered).
step buffered-vs-cache-aware 90 "${BENCH[@]}" buffered-vs-cache-aware "${COMMON[@]}" --model "$MODEL" "${BUF_ARGS[@]}"

# 4. Time-to-final, soft and hard (BRIEF: 24 ms median, flat in utterance length).
step time-to-final 60 "${BENCH[@]}" time-to-final "${COMMON[@]}" --model "$MODEL" --latency 160 "${TTF_ARGS[@]}"

# 5. Real-time streams at 160 ms and the batched step cost (BRIEF: 560 streams/H100 at 320 ms chunks).
step concurrency 75 "${BENCH[@]}" concurrency "${COMMON[@]}" --model "$MODEL" --latency 160 --keep-going "${CONC_ARGS[@]}"

# 6. Magpie TTS: our KV-cached step (CUDA graphs per batch bucket on CUDA; the JSON's large.fast_graphs says what
#    was captured and the memory it took) vs NeMo's generate_speech (357M shape, random weights), batched requests;
#    then our step in bf16 (357M only). The two runs write tts.json in turn: the fp32 one is kept as tts_fp32.json.
step tts 150 "${BENCH[@]}" tts "${COMMON[@]}" "${TTS_ARGS[@]}"
[[ -f "$OUT_DIR/tts.json" ]] && cp "$OUT_DIR/tts.json" "$OUT_DIR/tts_fp32.json"
step tts-bf16 75 "${BENCH[@]}" tts "${COMMON[@]}" --dtype bfloat16 "${TTS_BF16_ARGS[@]}"

# 6b. The Magpie GPU tests first (CUDA graphs vs the eager step, bf16 + graphs end to end), then the full
#     357M-shape greedy check (our codes vs NeMo's generate_speech) on the CPU side of the machine.
if [[ "$DRY" != "1" ]]; then
  step pytest-magpie-gpu 60 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_magpie_gpu_path.py tests/test_magpie_fast_step.py
fi
step magpie-greedy 90 "$PY" scripts/check_magpie_step.py "${GREEDY_ARGS[@]}"

# 7. GPU-marked tests, if any (exit 5: none collected), including the fast Magpie step on CUDA.
if [[ "$DRY" != "1" ]]; then
  step pytest-gpu 40 "$PY" -m pytest -m gpu -q -p no:cacheprovider
fi

# 8. Soak at 560 ms (BRIEF: 127 clients x 3 min, no latency growth), shortened to what is left of the budget.
LEFT=$((BUDGET_S - ($(date +%s) - START)))
SOAK_MIN=$("$PY" -c "print(round(max(0.2, min($SOAK_MAX_MIN, ($LEFT - 45) / 60)), 2))")
step soak "$LEFT" "${BENCH[@]}" soak "${COMMON[@]}" --model "$MODEL" --streams "$SOAK_STREAMS" \
  --minutes "$SOAK_MIN" --latency 560

log "done in $(($(date +%s) - START))s"
ls -la "$OUT_DIR" | tee -a "$LOG"
cat "$OUT_DIR/status.txt"
