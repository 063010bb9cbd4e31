#!/usr/bin/env bash
# A peers directory whose llama-server is built for AVX2 only (no AVX-512, no VNNI), for
# `bench peers` runs that stand in for an AVX2-only CPU on a machine that has AVX-512:
#
#   bash scripts/avx2_peers.sh [PEERS_DIR] [OUT_DIR]     # default /work/peers /work/peers-avx2
#   MIMO_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 \
#     MKL_ENABLE_INSTRUCTIONS=AVX2 python -m mimo.bench peers --peers llama-server \
#     --peers-dir OUT_DIR --port 0 --weight-bytes 0.944 --mimo-args "--dtype float32"
#
# OUT_DIR links every entry of PEERS_DIR (models, start scripts, sources) except the build,
# which is made anew from the same vendored llama.cpp with the instruction sets named.
# mimo's side: its AVX2 kernel build, torch's AVX2 code and oneDNN/MKL held to AVX2, and
# float32 activations (what `--dtype auto` picks on a CPU without native bf16). The memory
# system stays this machine's, so the rows compare the two engines' AVX2 code, not the CPUs.
set -euo pipefail
PEERS=${1:-/work/peers}
OUT=${2:-/work/peers-avx2}
SRC=$PEERS/src/llama_cpp_python-0.3.36/vendor/llama.cpp
[ -d "$SRC" ] || { echo "no llama.cpp sources at $SRC (set the peers up first)" >&2; exit 1; }
mkdir -p "$OUT"
for f in "$PEERS"/*; do
    [ "$(basename "$f")" = llama.cpp-build ] || ln -sfn "$f" "$OUT/$(basename "$f")"
done
cmake -S "$SRC" -B "$OUT/llama.cpp-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_OPENMP=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_CURL=OFF
cmake --build "$OUT/llama.cpp-build" -j"$(nproc)" --target llama-server
# no 512-bit register in the CPU backend: the build is AVX2 only
if objdump -d "$OUT/llama.cpp-build/bin/libggml-cpu.so" | grep -q zmm; then
    echo "libggml-cpu.so uses zmm registers: not an AVX2-only build" >&2; exit 1
fi
echo "AVX2-only llama-server in $OUT/llama.cpp-build/bin"
