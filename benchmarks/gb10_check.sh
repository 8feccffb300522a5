#!/usr/bin/env bash
# Every figure of the sm121 targets that needs a GB10 (DGX Spark, sm_121), in one command, from the repository root:
#
#     pip install -e ".[vllm]"                  # vLLM 0.33 (what GB10 users run) and the mxrepack plugin's entry point
#     pip install flashinfer-cubin              # or `vllm download-kernels`: FlashInfer's prebuilt kernels (below)
#     tmux new -s gb10                          # hours of engines: a dropped SSH session must not end the run
#     bash benchmarks/gb10_check.sh OUT_DIR     # each step's progress: tail -f OUT_DIR/<step>_*.log
#
# Before any step it checks what the run needs and stops, saying what is missing (MXREPACK_GB10_FORCE=1 runs anyway):
# vLLM importable with the mxrepack plugin registered, FlashInfer's CUTLASS fused MoE available to vLLM (vLLM 0.33
# treats FlashInfer as absent without flashinfer-cubin unless nvcc and ninja are on PATH; the sm121 cases need it), and
# about 90 GB free under the work folder.
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
# A step that fails is recorded and the next one runs, each under a time limit; the script exits nonzero at the end if
# any step failed or any engine case or conversion did not run. A Ctrl-C or hang-up bundles what exists. The
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
# that environment's own tools first (ninja, for FlashInfer's JIT, is installed beside its python, even when the
# environment is not activated)
if [[ $PYTHON == */* ]]; then export PATH="$(cd "$(dirname "$PYTHON")" && pwd):$PATH"; fi

# The plugin check's cases, in the order they run (each is compared with its baseline when that ran before it, and
# the plugin's with stock vLLM's Marlin case of the same mode). DISABLE_MMA_V3, which the *-mmav2 and *-mma2 cases set,
# makes a Hopper build mma.sync as sm_12x does; Triton builds no wgmma on sm_12x, so there it changes nothing.
PLUGIN_CASES=(
    source-marlin-graphs                   # stock vLLM, Marlin MoE: vLLM 0.33's default on sm_12x
    source-flashinfer-cutlass-mxfp8-graphs # stock vLLM, FlashInfer CUTLASS MXFP4 x MXFP8 MoE (the sm121 experts')
    sm121-experts-graphs                   # the sm121 experts, BF16 dense: bit-identical to the stock case above?
    sm121-graphs                           # the sm121 target as shipped: its MXFP4 dense layers' difference alone
    source-marlin-mmav2-graphs             # stock Marlin again, under DISABLE_MMA_V3 (the baseline of the next two;
                                           # the same engine as the first case's, started again: not compared)
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

# what the run needs, checked before hours of it: each problem one line; the run stops unless MXREPACK_GB10_FORCE=1
preflight() {
    "$PYTHON" - "$WORK" <<'EOF'
import shutil, sys

problems = []
try:
    import vllm

    if not vllm.__version__.startswith("0.33."):
        print(f"note: vLLM {vllm.__version__}; GB10 users run 0.33 (the plugin supports 0.26-0.33)")
except Exception as e:  # noqa: BLE001 - said
    problems.append(f"vLLM does not import ({type(e).__name__}: {e}): pip install vllm==0.33.0")
try:
    from importlib.metadata import entry_points

    if not any(ep.name == "mxrepack" for ep in entry_points(group="vllm.general_plugins")):
        problems.append('the mxrepack plugin is not registered with vLLM: pip install -e ".[vllm]" from this folder')
except Exception as e:  # noqa: BLE001
    problems.append(f"cannot list vLLM's plugins ({e})")
try:
    from vllm.utils import flashinfer as fi

    if not fi.has_flashinfer_cutlass_fused_moe():
        problems.append(
            "vLLM finds no FlashInfer CUTLASS fused MoE (the sm121 cases' backend): pip install flashinfer-cubin, or "
            "`vllm download-kernels`, or nvcc and ninja on PATH for FlashInfer's JIT"
        )
except Exception as e:  # noqa: BLE001
    problems.append(f"cannot ask vLLM about FlashInfer ({type(e).__name__}: {e})")
free = shutil.disk_usage(sys.argv[1]).free / 2**30
if free < 90:
    problems.append(f"{free:.0f} GiB free under {sys.argv[1]}: the checkpoints take about 65 GB (MXREPACK_GB10_WORK)")
for p in problems:
    print(f"preflight: {p}")
sys.exit(1 if problems else 0)
EOF
}

if ! preflight; then
    if [ "${MXREPACK_GB10_FORCE:-0}" != 1 ]; then
        echo "Stopped before any step (the lines above). MXREPACK_GB10_FORCE=1 runs anyway." >&2
        exit 2
    fi
    echo "MXREPACK_GB10_FORCE=1: running anyway"
fi

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
    timeout -k 60 600 "$PYTHON" - "$OUT_DIR/env_$TAG.json" "$COMMIT" <<'EOF'
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

# the plugin check exits 0 when engines fail (each case's error is in its record): what ran and what did not, here
# and in the bundle; a case, comparison or conversion that did not run counts as a failure of the whole check
summary() {
    "$PYTHON" - "$OUT_DIR/vllm_plugin_check_$TAG.json" "$OUT_DIR/vllm_convert_$TAG.json" <<'EOF'
import json, sys

bad = 0
try:
    check = json.load(open(sys.argv[1]))
    for name, rec in check["cases"].items():
        bad += not rec.get("ok")
        print(f"   {name}: {'ran' if rec.get('ok') else 'error: ' + str(rec.get('error'))[:160]}")
    for pair, cmp in check["comparisons"].items():
        if cmp.get("comparable"):
            print(f"   {pair}: bit-identical {cmp['bit_identical']}, max |logprob diff| {cmp['max_abs_logprob_diff']}")
        else:
            bad += 1
            print(f"   {pair}: not compared (one side did not run)")
except (OSError, ValueError, KeyError) as e:
    bad += 1
    print(f"   no plugin check record ({type(e).__name__}: {e})")
try:
    conversions = json.load(open(sys.argv[2])).get("conversions", {})
    if "error" in conversions:  # the conversion process itself left no record
        bad += 1
        print(f"   conversions: no record: {str(conversions['error'])[-300:]}")
    else:
        for target, rec in conversions.items():
            bad += rec.get("all_equal") is not True
            print(f"   convert {target}: {rec.get('all_equal', rec.get('error'))}")
except (OSError, ValueError, AttributeError) as e:
    bad += 1
    print(f"   no conversion record ({type(e).__name__}: {e})")
sys.exit(1 if bad else 0)
EOF
}

# everything to send back, in one file: each step's record and log, the summary, the steps' table, and the engines'
# own records (each case's tokens and logprobs, which later comparisons need) and logs
BUNDLE="gb10_check_$TAG.tgz"
bundle() {
    local f pack=() records=()
    for f in "$WORK"/vpc12/case-*.json "$WORK"/vpc12/case-*.log "$WORK"/convert/convert.json \
        "$WORK"/convert/convert.log; do
        if [ -e "$f" ]; then pack+=(-C "$(dirname "$f")" "$(basename "$f")"); fi
    done
    if [ ${#pack[@]} -gt 0 ]; then
        tar czf "$OUT_DIR/vllm_plugin_cases_$TAG.tgz" "${pack[@]}" || FAILED+=("packing the engines' files")
    fi
    mapfile -t records < <(cd "$OUT_DIR" && ls -d -- *"_$TAG".* | grep -vx -- "$BUNDLE")
    tar czf "$OUT_DIR/$BUNDLE" -C "$OUT_DIR" "${records[@]}" || FAILED+=("packing $BUNDLE")
    echo
    echo "Records: ${records[*]}"
    echo "Send back $OUT_DIR/$BUNDLE (all of them). The checkpoints the plugin check wrote, in $WORK, are not needed."
}
# a Ctrl-C or hang-up part way: what exists is still bundled
trap 'trap - INT TERM HUP; echo "interrupted: bundling what exists" >&2; bundle; exit 130' INT TERM HUP

step env "env_$TAG.json" env_record
# each step under a time limit (SIGTERM, then SIGKILL a minute later): a hung GPU call ends its step, not the run.
# The limits are generous guesses: nothing here has run on a GB10
step kernels_check "kernels_check_$TAG.json" \
    to_file "$OUT_DIR/kernels_check_$TAG.json" timeout -k 60 3600 "$PYTHON" -m mxrepack.cli kernels check --arch 121 \
    --json
step peers_moe "peers_moe_$TAG.json" \
    timeout -k 60 7200 "$PYTHON" benchmarks/peers.py --only moe --commit "$COMMIT" --json "$OUT_DIR/peers_moe_$TAG.json"
step peers_moe_e32 "peers_moe_e32_$TAG.json" \
    timeout -k 60 7200 "$PYTHON" benchmarks/peers.py --only moe --experts 32 --moe-t 512,2048,4096 --commit "$COMMIT" \
    --json "$OUT_DIR/peers_moe_e32_$TAG.json"
step peers_dense "peers_dense_$TAG.json" \
    timeout -k 60 7200 "$PYTHON" benchmarks/peers.py --only dense --commit "$COMMIT" \
    --json "$OUT_DIR/peers_dense_$TAG.json"

# one engine per case, 64 sequences' decode timed beside one's (as the lent GPU's 12-layer runs); an hour an engine
# at most, for a first start that compiles FlashInfer's kernels
CASE_LIST=$(IFS=,; echo "${PLUGIN_CASES[*]}")
step vllm_plugin_check "vllm_plugin_check_$TAG.json" \
    "$PYTHON" benchmarks/vllm_plugin_check.py --work "$WORK/vpc12" --layers 12 --batches 1,64 --engine-timeout 3600 \
    --commit "$COMMIT" --cases "$CASE_LIST" --json "$OUT_DIR/vllm_plugin_check_$TAG.json"
step vllm_convert "vllm_convert_$TAG.json" \
    "$PYTHON" benchmarks/vllm_plugin_check.py --work "$WORK/convert" --layers 2 --cases "" --convert \
    --engine-timeout 3600 --commit "$COMMIT" --json "$OUT_DIR/vllm_convert_$TAG.json"

echo "== the plugin check's cases, comparisons and conversions"
summary > "$OUT_DIR/summary_$TAG.txt" 2>&1 || FAILED+=("a case, comparison or conversion that did not run")
cat "$OUT_DIR/summary_$TAG.txt"
bundle
echo "Steps and their exit statuses: $STEPS"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "Failed: ${FAILED[*]} (the logs and the summary say why; the other steps ran to their end)" >&2
    exit 1
fi
