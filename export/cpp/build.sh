#!/usr/bin/env bash
# Builds savedmodel_check against the tensorflow wheel's headers and libraries, cached by content hash.
#
# Usage: export/cpp/build.sh [PYTHON]    (default: .venv/bin/python of the repo, else python3)
# Prints the path of the binary: build/export_cpp/<hash>/savedmodel_check, where <hash> covers the source,
# this script and the tensorflow version, so an unchanged checkout never recompiles (a build takes a few
# minutes on 2 cores). Needs g++ with C++17. Environment: CXX (default g++), BUILD_DIR (default <repo>/build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${1:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
cxx="${CXX:-g++}"
command -v "$cxx" >/dev/null || { echo "build.sh: $cxx not found" >&2; exit 2; }

# locate the wheel without importing tensorflow (fast)
read -r tf_dir tf_version < <("$python" - <<'PY'
import importlib.metadata, importlib.util
spec = importlib.util.find_spec("tensorflow")
print(spec.submodule_search_locations[0], importlib.metadata.version("tensorflow"))
PY
)
src="$here/savedmodel_check.cc"
hash="$( (cat "$src" "$here/build.sh"; echo "$tf_version $tf_dir $cxx") | sha256sum | cut -c1-16)"
out_dir="${BUILD_DIR:-$repo/build}/export_cpp/$hash"
binary="$out_dir/savedmodel_check"
if [[ -x "$binary" ]]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$out_dir"
tmp="$binary.tmp.$$"
trap 'rm -f "$tmp"' EXIT
echo "build.sh: compiling $src against tensorflow $tf_version (a few minutes)" >&2
"$cxx" -std=c++17 -O1 -Wno-deprecated-declarations -Wno-interference-size -D_GLIBCXX_USE_CXX11_ABI=1 -DEIGEN_MAX_ALIGN_BYTES=64 \
  -I"$tf_dir/include" "$src" -o "$tmp" \
  -L"$tf_dir" -Wl,--no-as-needed -l:libtensorflow_framework.so.2 -l:libtensorflow_cc.so.2 \
  -Wl,-rpath,"$tf_dir"
mv -f "$tmp" "$binary"
echo "$binary"
