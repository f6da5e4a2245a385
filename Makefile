# ttsaot — the README's two commands are `make demo` and `make test`; both set up a fresh machine first.
PY ?= python3
PIP ?= $(PY) -m pip
ART ?= artifacts
PYTEST_WORKERS ?= 2
# Upstream packages used only as parity oracles; installed without their dependency trees, which would
# replace the CPU torch (qwen-tts pins torchaudio; vllm-omni pulls vllm).
ORACLE_WHEELS = qwen-tts==0.1.1 voxcpm==2.0.3 vllm-omni==0.30.0 fish-speech==0.1.0

.PHONY: setup setup-dev demo test test-all test-gpu bench gpu-wheels lint clean

setup:
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[builder,audio]"

setup-dev: setup
	$(PIP) install -q -e ".[builder,audio,test,onnx,oracle]"
	$(PIP) install -q --no-deps $(ORACLE_WHEELS)

demo: setup
	build-artifacts build qwen3-tts-12hz --stages code2wav --preset tiny --random-weights --device cpu --dtype fp32 \
		--batch-buckets 1,2 --frame-buckets 16,48 --chunk-frames 16 --left-context-frames 32 \
		--nonstreaming-chunk-frames 0 --out $(ART)
	build-artifacts build fish-s2-pro --stages dac_decoder,dac_encoder --preset tiny --random-weights --device cpu \
		--batch-buckets 1 --frame-buckets 24 --chunk-frames 8 --left-context-frames 8 --first-chunk-frames 0 \
		--encoder-seconds 1 --out $(ART)
	build-artifacts inspect $(ART)/qwen3-tts-12hz
	build-artifacts inspect $(ART)/fish-s2-pro
	$(PY) examples/demo.py --artifacts $(ART) --out demo_out

# `make test` is what CI runs (2 cores, well under 30 min); `make test-all` adds the heavy end-to-end builds.
test: setup-dev
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not gpu and not heavy" tests

test-all: setup-dev
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not gpu" tests

test-gpu:
	CXX=$${TTSAOT_CXX:-/usr/bin/g++} $(PY) -m pytest -m gpu tests -v -n auto --dist loadgroup

bench:
	$(PY) -m bench --out bench/results

lint:
	$(PY) -m ruff check builder runtime tests bench examples
	$(PY) -m ruff format --check builder runtime tests bench examples

clean:
	rm -rf $(ART)/*/ .pytest_artifacts demo_out

# Wheels for the GPU machine (Python 3.12, no registry there): the upstream packages the bench compares against and
# what they import that the machine lacks, and the streaming service + load test (examples/serve). Carry .whl/ with
# the device call; bench/gpu_plan.sh installs them.
GPU_WHEELS = $(ORACLE_WHEELS) einops pydantic==2.14.3 pydantic-core==2.50.4 typing-inspection annotated-types \
	typing-extensions soundfile soxr cffi pycparser pytest-xdist execnet omegaconf antlr4-python3-runtime \
	starlette uvicorn h11 httptools uvloop click httpx httpcore anyio idna certifi prometheus-client
gpu-wheels:
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
		-d .whl $(GPU_WHEELS)

