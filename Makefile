# archspace: `make test` is the one command CI runs (setup if needed, build, ctest, pytest).
BUILD ?= build
JOBS ?= $(shell nproc)
PY := .venv/bin/python

.PHONY: all setup build test format-check format unit pytest kernel-paths bench corpus demo study clean fuzz fuzz-smoke

all: build

setup:
	bash scripts/setup.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DARCHSPACE_WERROR=ON

build: setup $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# --durations: the slowest tests in every log, where CI time goes (CI must stay under 60 minutes).
pytest: build
	$(PY) -m pytest -q --durations=25 tests/python

# The unit tests and pytest's numerics tests again on the other CPU kernel paths (scripts/kernel_paths.sh:
# ATen's AVX2 and scalar kernels, MKL's compatible GEMM, oneDNN capped, the engine's GEMV off), so that no
# bound depends on which kernel this CPU dispatches to. The 65,536-token test stays native only (4 minutes
# natively; the KV-cache tests cover the same code at lengths that run in seconds on every path). Suites that
# compute no floating-point tensors (parsers, configs, files, text metrics, the code sandbox, the tokenizer) run
# natively only: no kernel path changes what they do, and they were a third of the time of each pass.
KERNEL_PATH_PYTESTS := tests/python/test_hf_parity.py tests/python/test_variant.py tests/python/test_trace.py \
                       tests/python/test_export.py
NATIVE_ONLY_SUITES := LongContext|CodeTasks|CodeSandbox|Safetensors|SafetensorsErrors|GenerationMetrics|Chat|\
                      ParameterTables|TrainConfig|Config|ConfigErrors|Presets|Strings|JsonDepth|WeightsCheck|Tokenizer|\
                      Utf8|CompletionText|TaskGroups|DownstreamTasks|ShardErrors|ShardWriter|ShardVerification|\
                      TokenFormats|IndexPermutation|RunDirLock|VerifyCheckpoint|MetricsLog|Trackers|TensorBoardEvents|\
                      RunTokenizer|Sweep|Schedule|Profiler|DepthSources|SuiteTable|PythonText|GenerationTaskRegistry|\
                      SchedulerPolicy|PublishCheckpoint|FileWriter|DropLlama3
# On a CPU without AVX512 the native path is the avx2 one (ATen, oneDNN and the engine all pick AVX2): its pass would
# repeat the native run bit for bit, so it runs only where AVX512 is present.
KERNEL_PATHS := $(shell grep -qw avx512f /proc/cpuinfo && echo "avx2 baseline" || echo baseline)
kernel-paths: build
	@echo "kernel paths beside native: $(KERNEL_PATHS)"
	for p in $(KERNEL_PATHS); do \
	  bash scripts/kernel_paths.sh $$p sh -c 'cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -E "^($(subst $(eval) ,,$(NATIVE_ONLY_SUITES)))[.]"' || exit 1; \
	  bash scripts/kernel_paths.sh $$p $(PY) -m pytest -q $(KERNEL_PATH_PYTESTS) || exit 1; \
	done

# Formatting first: it takes a second and names the files to fix.
test: format-check unit pytest kernel-paths fuzz-smoke

format-check: setup
	bash scripts/check_format.sh

format:
	bash scripts/check_format.sh --fix

demo: build
	bash scripts/demo.sh

corpus: build
	bash scripts/prepare_corpus.sh

# A small normalization study on this CPU (docs/analysis.md "A small study"): about 24 minutes on two idle cores (five seeds per arm of base against siamese_depth, judged by compare).
study: build
	bash scripts/study.sh

bench: build
	$(PY) bench/bench_logits.py
	$(PY) bench/bench_variant.py
	$(PY) bench/bench_tokenizer.py
	$(PY) bench/bench_train.py
	$(PY) bench/bench_train_step.py
	$(PY) bench/bench_fused_kernels.py
	$(PY) bench/bench_generate.py
	$(PY) bench/bench_decode_dtype.py
	$(PY) bench/bench_bf16_commands.py
	$(PY) bench/bench_threads.py
	$(PY) bench/bench_downstream.py
	$(PY) bench/bench_generation_eval.py
	$(PY) bench/bench_dist.py
	$(PY) bench/bench_serve.py
	$(PY) bench/bench_llama_cpp.py
	mkdir -p bench/results && $(BUILD)/bench_linear --out bench/results/linear-$$(date +%Y%m%d-%H%M%S).json
	$(BUILD)/bench_linear --dtype bf16 --out bench/results/linear-bf16-$$(date +%Y%m%d-%H%M%S).json

# libFuzzer targets of fuzz/ (clang, ASan + UBSan; docs/faults.md): FUZZ_SECONDS each.
FUZZ_SECONDS ?= 300
fuzz: setup
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

# The short run `make test` includes: 3,000 inputs per target from a fixed seed (about 2 s each).
fuzz-smoke: setup
	FUZZ_RUNS=3000 bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD)
