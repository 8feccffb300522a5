#!/usr/bin/env bash
# Every figure of the sm121 targets that needs a GB10 (DGX Spark, sm_121), in one command, from the repository root:
#
#     pip install -e ".[vllm]"                  # vLLM 0.33 (what GB10 users run) and the mxrepack plugin's entry point
#     bash benchmarks/gb10_check.sh OUT_DIR
#
# Writes each step's record into OUT_DIR as <step>_<device>_<date>_<commit>.json (device "gb10" on compute capability
# 12.1, else sm<major><minor>), its output beside it as .log, and a table of the steps' exit statuses. The steps:
#   env             the GPU, the versions (torch, Triton, vLLM, FlashInfer) and whether vLLM finds FlashInfer's CUTLASS
#                   fused MoE (0.33 needs flashinfer-cubin, or nvcc and ninja for FlashInfer's JIT)
#   kernels_check   every shipped Triton kernel configuration AOT-built for sm_121 (`repack kernels check --arch 121`)
#   peers_moe       mxrepack's MoE kernels (rows and mma2 orders) against vLLM's Marlin and triton_kernels, 120b shapes
#                   (128 experts); a peer that does not build here is an error row
#   peers_moe_e32   the same at the 20b's 32 experts, 512 / 2048 / 4096 tokens
#   peers_dense     mxrepack's dense MXFP4 kernels (mma2 order) against vLLM's Marlin MXFP4 linear and cuBLAS BF16
#   vllm_plugin_check  real vLLM engines, 12 layers of the 20b's shapes, compiled + CUDA graphs (PLUGIN_CASES below)
#   vllm_convert    the sm80/sm90/sm100/sm121 targets' experts against this vLLM's own load-time conversion, byte by
#                   byte (2 layers; the sm90 experts are swizzled for a Hopper: here they may differ or fail)
# A step that fails is recorded and the next one runs; the script exits nonzero at the end if any failed. The
# checkpoints the two plugin checks write (MXREPACK_GB10_WORK, default OUT_DIR/work) take about 65 GB of disk (worked
# out from their sizes: 7 of 12 layers, 5 of 2, the 201088-token embeddings in each); how long it all takes on a GB10 is
# not known (each engine compiles; nothing here has run there).
set -euo pipefail

OUT_DIR=${1:?usage: bash benchmarks/gb10_check.sh OUT_DIR}
if [ ! -f benchmarks/vllm_plugin_check.py ]; then
    echo "run from the repository root (benchmarks/ not found here)" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=${MXREPACK_GB10_WORK:-$OUT_DIR/work}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PYTHON=${PYTHON:-$(command -v python || command -v python3 || echo python)}  # the environment vLLM is installed in
export PYTHONUNBUFFERED=1

# The plugin check's cases, in the order they run (each is compared with its baseline when that ran before it, and
# the plugin's with stock vLLM's Marlin case of the same mode). DISABLE_MMA_V3, which the *-mmav2 and *-mma2 cases set,
# makes a Hopper build mma.sync as sm_12x does; Triton builds no wgmma on sm_12x, so there it changes nothing.
PLUGIN_CASES=(
    source-marlin-graphs                   # stock vLLM, Marlin MoE: vLLM 0.33's default on sm_12x
    source-flashinfer-cutlass-mxfp8-graphs # stock vLLM, FlashInfer CUTLASS MXFP4 x MXFP8 MoE (the sm121 experts')
    sm121-experts-graphs                   # the sm121 experts, BF16 dense: bit-identical to the stock case above?
    sm121-graphs                           # the sm121 target as shipped: its MXFP4 dense layers' difference alone
    source-marlin-mmav2-graphs             # stock Marlin again, under DISABLE_MMA_V3 (the baseline of the next two;
                                           # beside the first case: two starts of one stock engine)
    strided-mmav2-graphs                   # strided experts, rows order, BF16 dense
    strided-mma2-graphs                    # the sm121-strided target (mma2 experts and dense)
    marlin-dense-graphs                    # Marlin experts, MXFP4 dense on vLLM's Marlin linear (the next's baseline)
    dense-mma2-graphs                      # the same dense values in the mma2 order on mxrepack's dense tiles
)

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$COMMIT" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    COMMIT="$COMMIT-dirty"  # the records are of uncommitted changes: said in every name
fi
DAY=$(date +%F)
DEVICE=$("$PYTHON" -c 'import torch; a, b = torch.cuda.get_device_capability(); print(f"sm{a}{b}")' 2>/dev/null ||
    echo nogpu)
if [ "$DEVICE" = sm121 ]; then DEVICE=gb10; fi  # the only sm_121 GPU there is
if [ "$DEVICE" != gb10 ]; then
    echo "warning: this GPU is $DEVICE, not a GB10 (compute capability 12.1); the records are named for it" >&2
fi
TAG=${DEVICE}_${DAY}_${COMMIT}
STEPS="$OUT_DIR/steps_$TAG.tsv"
printf 'step\texit\tseconds\trecord\n' > "$STEPS"
FAILED=()

# step NAME RECORD COMMAND...: runs COMMAND with its output in OUT_DIR/NAME_TAG.log, notes its exit status and time
step() {
    local name=$1 record=$2 start rc=0
    shift 2
    echo "== $name ($(date +%T); output: $OUT_DIR/${name}_$TAG.log)"
    start=$(date +%s)
    "$@" > "$OUT_DIR/${name}_$TAG.log" 2>&1 || rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$record" >> "$STEPS"
    if [ "$rc" -ne 0 ]; then
        FAILED+=("$name (exit $rc)")
        echo "   failed (exit $rc): see $OUT_DIR/${name}_$TAG.log"
    fi
}

# stdout to a file (the kernels check prints its JSON records there, and exits nonzero after printing them when a
# build failed)
to_file() {
    local out=$1
    shift
    "$@" > "$out"
}

env_record() {
    "$PYTHON" - "$OUT_DIR/env_$TAG.json" "$COMMIT" <<'EOF'
import importlib, json, platform, subprocess, sys

record = {"commit": sys.argv[2], "python": platform.python_version(), "machine": platform.machine()}
for name in ("torch", "triton", "vllm", "flashinfer", "mxrepack"):
    try:
        record[name] = importlib.import_module(name).__version__
    except Exception as e:  # noqa: BLE001 - recorded
        record[name] = f"not importable: {type(e).__name__}: {e}"[:300]
try:
    import torch

    record["device"] = torch.cuda.get_device_name()
    record["capability"] = list(torch.cuda.get_device_capability())
    record["cuda"] = torch.version.cuda
except Exception as e:  # noqa: BLE001
    record["device"] = f"no CUDA device: {e}"[:300]
try:  # what vLLM's FlashInfer CUTLASS MoE backend checks first (FlashInferExperts._supports_current_device)
    from vllm.utils import flashinfer as fi

    record["vllm_flashinfer"] = {
        f: getattr(fi, f)() for f in ("has_flashinfer", "has_flashinfer_cubin", "has_flashinfer_cutlass_fused_moe")
        if hasattr(fi, f)
    }
except Exception as e:  # noqa: BLE001
    record["vllm_flashinfer"] = f"{type(e).__name__}: {e}"[:300]
try:
    record["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv"],
        capture_output=True, text=True, timeout=60,
    ).stdout
except Exception as e:  # noqa: BLE001
    record["nvidia_smi"] = f"{type(e).__name__}: {e}"
open(sys.argv[1], "w").write(json.dumps(record, indent=1))
print(json.dumps(record, indent=1))
EOF
}

step env "env_$TAG.json" env_record
step kernels_check "kernels_check_$TAG.json" \
    to_file "$OUT_DIR/kernels_check_$TAG.json" "$PYTHON" -m mxrepack.cli kernels check --arch 121 --json
step peers_moe "peers_moe_$TAG.json" \
    "$PYTHON" benchmarks/peers.py --only moe --commit "$COMMIT" --json "$OUT_DIR/peers_moe_$TAG.json"
step peers_moe_e32 "peers_moe_e32_$TAG.json" \
    "$PYTHON" benchmarks/peers.py --only moe --experts 32 --moe-t 512,2048,4096 --commit "$COMMIT" \
    --json "$OUT_DIR/peers_moe_e32_$TAG.json"
step peers_dense "peers_dense_$TAG.json" \
    "$PYTHON" benchmarks/peers.py --only dense --commit "$COMMIT" --json "$OUT_DIR/peers_dense_$TAG.json"
# one engine per case, 64 sequences' decode timed beside one's (as the lent GPU's 12-layer runs); an hour an engine
# at most, for a first start that compiles FlashInfer's kernels
CASE_LIST=$(IFS=,; echo "${PLUGIN_CASES[*]}")
step vllm_plugin_check "vllm_plugin_check_$TAG.json" \
    "$PYTHON" benchmarks/vllm_plugin_check.py --work "$WORK/vpc12" --layers 12 --batches 1,64 --engine-timeout 3600 \
    --commit "$COMMIT" --cases "$CASE_LIST" --json "$OUT_DIR/vllm_plugin_check_$TAG.json"
step vllm_convert "vllm_convert_$TAG.json" \
    "$PYTHON" benchmarks/vllm_plugin_check.py --work "$WORK/convert" --layers 2 --cases "" --convert \
    --engine-timeout 3600 --commit "$COMMIT" --json "$OUT_DIR/vllm_convert_$TAG.json"

# the plugin check exits 0 when engines fail (each case's error is in its record): what ran and what did not, here
echo "== the plugin check's cases, comparisons and conversions"
"$PYTHON" - "$OUT_DIR/vllm_plugin_check_$TAG.json" "$OUT_DIR/vllm_convert_$TAG.json" <<'EOF' || true
import json, sys

try:
    check = json.load(open(sys.argv[1]))
    for name, rec in check["cases"].items():
        print(f"   {name}: {'ran' if rec.get('ok') else 'error: ' + str(rec.get('error'))[:160]}")
    for pair, cmp in check["comparisons"].items():
        if cmp.get("comparable"):
            print(f"   {pair}: bit-identical {cmp['bit_identical']}, max |logprob diff| {cmp['max_abs_logprob_diff']}")
except (OSError, ValueError, KeyError) as e:
    print(f"   no plugin check record ({type(e).__name__}: {e})")
try:
    for target, rec in json.load(open(sys.argv[2])).get("conversions", {}).items():
        print(f"   convert {target}: {rec.get('all_equal', rec.get('error'))}")
except (OSError, ValueError, AttributeError) as e:
    print(f"   no conversion record ({type(e).__name__}: {e})")
EOF

# the engines' own records (each case's tokens and logprobs, which later comparisons need) and logs, and the
# conversion check's, in one file
PACK=()
for f in "$WORK"/vpc12/case-*.json "$WORK"/vpc12/case-*.log "$WORK"/convert/convert.json "$WORK"/convert/convert.log; do
    if [ -e "$f" ]; then PACK+=(-C "$(dirname "$f")" "$(basename "$f")"); fi
done
if [ ${#PACK[@]} -gt 0 ]; then
    tar czf "$OUT_DIR/vllm_plugin_cases_$TAG.tgz" "${PACK[@]}" || FAILED+=("packing the engines' files")
fi

# everything to send back, in one file: each step's record and log, the steps' table, the engines' files
BUNDLE="gb10_check_$TAG.tgz"
mapfile -t RECORDS < <(cd "$OUT_DIR" && ls -d -- *"_$TAG".* | grep -vx -- "$BUNDLE")
tar czf "$OUT_DIR/$BUNDLE" -C "$OUT_DIR" "${RECORDS[@]}" || FAILED+=("packing $BUNDLE")
echo
echo "Records: ${RECORDS[*]}"
echo "Send back $OUT_DIR/$BUNDLE (all of them). The checkpoints the plugin check wrote, in $WORK, are not needed."
echo "Steps and their exit statuses: $STEPS"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "Failed: ${FAILED[*]} (their logs say why; the other steps ran to their end)" >&2
    exit 1
fi
