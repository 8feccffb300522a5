#!/usr/bin/env bash
# On the lent GPU machine, from the repository root:  bash benchmarks/vllm_plugin_device.sh KITDIR [check arguments]
# Puts vLLM 0.26 there (../shared/tools/vllm-kit: KITDIR holds the part(s) this call carries), makes the mxrepack
# plugin's entry point visible to vLLM without pip (a dist-info beside the source tree: what `pip install -e .` would
# register), then, once every part is there, runs benchmarks/vllm_plugin_check.py with the remaining arguments.
KIT=${1:?usage: vllm_plugin_device.sh KITDIR [args]}; shift
source "$KIT/device.sh" "$KIT"
python3 -c "import vllm" 2>/dev/null || exit 0   # parts still missing: the next call carries the next one
EP=/tmp/mxrepack-ep/mxrepack-0.2.0.dist-info
mkdir -p "$EP"
printf 'Metadata-Version: 2.1\nName: mxrepack\nVersion: 0.2.0\n' > "$EP/METADATA"
printf '[vllm.general_plugins]\nmxrepack = mxrepack.serve.vllm:register\n' > "$EP/entry_points.txt"
export PYTHONPATH=$PWD:/tmp/mxrepack-ep:$PYTHONPATH PYTHONUNBUFFERED=1
[ $# -gt 0 ] && python3 benchmarks/vllm_plugin_check.py "$@"
