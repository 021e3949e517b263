#!/usr/bin/env bash
# Installs oneCCL (Intel's CPU collectives) and Intel MPI from PyPI's wheels into PREFIX
# (default bench/oneccl/env), applies the two fixes the wheels need, and builds
# ccl_allreduce there. bench/interleaved.py --libs ...,oneccl runs it.
#   - libccl.so.1 lists libccl.so.2 as needed, which the wheel does not ship: a link to
#     libccl.so.1.0 satisfies it;
#   - its _intel_fast_memcpy and __intel_cpu_feature* come from libintlc.so.5, in
#     intel-cmplr-lib-rt.
# oneccl-cpu declares a libfabric wheel that PyPI may lack; Intel MPI brings its own, so the
# wheels go in without their declared dependencies.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PREFIX="${1:-$HERE/env}"
PY="${PYTHON:-python3}"
"$PY" -m venv "$PREFIX"
"$PREFIX/bin/pip" install -q --no-deps oneccl-cpu==2022.2.0 oneccl-cpu-devel==2022.2.0 \
  intel-cmplr-lib-rt impi-rt==2021.19 impi-devel==2021.19
ln -sf libccl.so.1.0 "$PREFIX/lib/libccl.so.2"
test -e "$PREFIX/lib/libintlc.so.5" || { echo "libintlc.so.5 missing in $PREFIX/lib" >&2; exit 1; }
g++ -O2 -std=c++17 "$HERE/ccl_allreduce.cpp" -I"$PREFIX/include" -L"$PREFIX/lib" \
  -Wl,-rpath,"$PREFIX/lib" -lccl -lintlc -lmpi -o "$PREFIX/bin/ccl_allreduce"
echo "oneCCL ready: $PREFIX/bin/ccl_allreduce"
