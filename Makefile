# The two commands: `make writeup` (the main job) and `make test`.
# Both create .venv in the repo root and install the project into it when needed.
#
#   make writeup                 execute notebooks/*.ipynb, export writeups/*.html + index.html
#   make writeup PROFILE=gpu     the same at the reference sizes (needs CUDA)
#   make writeup ADAPTERS=PATH   the same with a "yours" row from your tests/adapters.py
#   make writeup EDITION=2024    the same for one course edition's handout (2024, 2025 or 2026; default auto: each
#                                notebook's own default), injected into every notebook as EDITION
#   make writeup BUDGET=300      cpu profile: give each notebook's timed runs 300 s (default auto: a few minutes
#                                in all on a 2-core laptop; none: every size; each notebook names what it left out)
#   make test                    pytest on tests/ and nbval on notebooks/ (what CI runs; TEST_WORKERS=1: one at a
#                                time); on a GPU the smoke run: every notebook at the cpu profile's sizes on the GPU
#                                and the kernel tests compiled, on up to 4 workers (TESTS=tests: all of tests/)
#   make test-ci                 what CI runs after make test: the slow end-to-end checks marked `ci` (kernels compiled
#                                for sm_80/sm_90a, the compile cache's repro, the pages and JupyterLab in headless
#                                Chromium), then make test-newest-triton
#   make test-newest-triton      the kernel tests again under NEWEST_TRITON's interpreter
#   make lab                     JupyterLab on the project's .venv (--allow-root when run as root, e.g. in a container)
#   make strip                   clear notebook outputs before committing
#   make lint                    ruff check and ruff format --check (make test runs both, in tests/test_style.py)
#   make format                  ruff format, then ruff check --fix: what lint asks, applied
#   make bench [TOPICS=ddp]      the benchmark scripts (python -m helpers bench TOPIC), one after another
#   make bench TOPICS=walltime   each notebook's and the test suite's wall and CPU time, saved (python -m helpers
#                                bench walltime --suite; ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2: no fast bf16)
#   make stress [RUNS=200]       spawn-train-exit scripts per wrapper: does a rank die at exit? (not part of make test)
#   make yours ADAPTERS=PATH     your assignment's tests/adapters.py checked and timed beside ours (writeups/yours.html)
#                                ARGS="--topics attention --python ../a2/.venv/bin/python": more options
#   make reference [BUDGET_S=1500] [REFERENCE_ARGS="--only kernels 01"]
#                                on a GPU: python -m helpers reference, the gpu profile's work in timed batches
#                                into data/reference/<device>/ (resumes; see README "On a lent GPU machine")
#   make wheels                  download requirements-notebook.txt's wheels (CPython 3.12, Linux x86_64) into
#                                build/wheels/, to carry to an offline GPU machine (README "On a lent GPU machine")
#
# TORCH is installed first: the default resolves to a local CPU build on the
# course machines and to a CUDA build from PyPI elsewhere. On a machine whose
# Python already has a CUDA torch, reuse it:
#   make setup VENV_ARGS=--system-site-packages TORCH=
# TRITON is the course's pin (2026: triton 3.6, torch 2.11's and the GPU image's), installed only where the torch just
# installed requires no Triton of its own: a CPU build, so a student's block-pointer kernel runs in the interpreter
# here. PyPI's CUDA wheels require the one Triton inductor was built for (2.11: 3.6; 2.13: its own), which is kept
# (helpers/pins.py decides). With TORCH= it is empty too (the machine's own triton matches its torch).
# CI (.ci/run) runs the kernel tests again under NEWEST_TRITON after make test (make test-ci), so the
# kernels work in both: all but test_yours.py, whose Triton runtime (the interpreter's semantics) is
# test_yours_triton.py's. A student's make test checks the course's Triton, the one their environment has.

PYTHON    ?= python3
VENV      := .venv
PY        := $(VENV)/bin/python
TORCH     ?= torch==2.13.0
TRITON    ?= $(if $(strip $(TORCH)),triton==3.6.0; platform_system == 'Linux')
NEWEST_TRITON ?= triton==3.9.0
NEWEST_DIR := build/newest-triton
NEWEST_TESTS := tests/test_rmsnorm.py tests/test_attention.py tests/test_kernels.py tests/test_yours_triton.py
KERNEL_TESTS := $(NEWEST_TESTS) tests/test_yours.py
VENV_ARGS ?=
PROFILE   ?= auto
BUDGET    ?= auto
EDITION   ?= auto
TOPICS    ?= rmsnorm collectives ddp sharding attention fsdp
RUNS      ?= 200
ADAPTERS  ?=
ARGS      ?=
BUDGET_S  ?= 1500
REFERENCE_ARGS ?=
WHEELS_DIR ?= build/wheels
WHEELS_PYTHON ?= 3.12

.PHONY: setup test test-ci test-newest-triton lint format writeup lab strip bench stress yours reference wheels smoke-wheels smoke-offline clean

# A PYTHON that is itself a venv (GPU images: torch in /opt/.../.venv): --system-site-packages would show .venv only
# the *base* interpreter's packages (CPython #95469), so a .pth file in .venv lists the outer venv's site-packages.
OUTER_SITE = $(shell $(PYTHON) -c "import site, sys; print(*site.getsitepackages() if sys.prefix != sys.base_prefix else ())")

$(PY):
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)
	$(if $(and $(findstring --system-site-packages,$(VENV_ARGS)),$(strip $(OUTER_SITE))),\
	    printf '%s\n' $(OUTER_SITE) > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer-venv.pth")

# TRITON, or nothing where the installed torch requires a Triton: helpers/pins.py reads torch's metadata (run as a
# script, it imports neither torch nor helpers) and prints the requirement, which joins the project's install
TRITON_FOR_TORCH = $(if $(strip $(TRITON)),$(PY) helpers/pins.py "$(TRITON)")

# Bytecode: pip byte-compiles every module it installs, on one core (about 20 s of a 2-core laptop's setup, torch
# and the Jupyter stack). Installed with --no-compile instead, the modules a run imports are compiled once by
# warm-ups in two streams: WARM_TORCH then WARM_LIBS in the background once torch is in (a module of a package still
# being unpacked just fails to import there, and is compiled at its first real import), beside the project's install
# then WARM_TOOLS and WARM_TESTS (collecting tests/ saves pytest's assertion rewriting of the test files once, where
# make test's workers would each do it at their start, 3-4 s apiece); any other module at its first import. So that
# each is written once, not compiled again in every process, a PYTHONDONTWRITEBYTECODE from the environment (some
# images set it) is not passed to what make runs: .venv and this repository's __pycache__ folders are ours. A warm-up
# that fails costs nothing but time: the import fails again, with its message, where a run needs it.
# pip: Python 3.11's own (23.2) spends 15 s of the project's install on matching every link of the indexes' pages
# to this platform's tags; a current pip takes 7 s (a 2-core EPYC, 127 packages). Upgraded first, from wherever pip
# installs from; offline, where none is found, the venv's own pip stays.
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL = $(PY) -m pip install --quiet --no-compile
# The project's requirements: uv (installed into .venv from PyPI first, 1-2 s) resolves and unpacks them in parallel
# (3.5 s on a 2-core EPYC, the same 127 versions pip picks; pip took 13); pip stays where uv is not installed
# (offline) or fails, and is the only installer where .venv sees another environment's packages
# (--system-site-packages: uv would not count a torch seen through outer-venv.pth, and would install one). uv reads
# no pip configuration: an index given to pip in the environment (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL) is passed on
USE_UV = $(if $(findstring --system-site-packages,$(VENV_ARGS)),,1)
UV_INSTALL = test -x $(VENV)/bin/uv && env UV_HTTP_TIMEOUT=20 $${PIP_INDEX_URL:+UV_INDEX_URL=$$PIP_INDEX_URL} \
	$${PIP_EXTRA_INDEX_URL:+UV_EXTRA_INDEX_URL="$$PIP_EXTRA_INDEX_URL"} $(VENV)/bin/uv pip install --quiet --python $(PY)
WARM_TORCH = torch._dynamo torch._inductor.compile_fx torch.distributed.fsdp
WARM_LIBS = helpers.launch triton pandas
WARM_TOOLS = nbval.plugin xdist nbclient ipykernel.kernelapp matplotlib.pyplot selenium.webdriver
WARM = $(PY) -c 'import importlib as i, importlib.util as u, sys; \
    [i.import_module(m) for m in sys.argv[1].split() if u.find_spec(m.split(".")[0])]'
WARM_TESTS = $(PY) -m pytest --collect-only -q -p no:cacheprovider tests
# Our editable install builds with the venv's own setuptools where it has one that pyproject.toml accepts (Python
# 3.11's venv does; 3.12's has none): an isolated build installs setuptools again first (5 s)
NO_ISOLATION = $(PY) -c 'import setuptools as s; print("--no-build-isolation" * (int(s.__version__.split(".")[0]) >= 64))' \
	2>/dev/null

$(VENV)/.installed: pyproject.toml Makefile | $(PY)
	$(PIP_INSTALL) --upgrade pip
	$(if $(USE_UV),$(PIP_INSTALL) uv >/dev/null 2>&1 || true)
	$(if $(strip $(TORCH)),$(PIP_INSTALL) "$(TORCH)")
	{ $(WARM) "$(WARM_TORCH)"; $(WARM) "$(WARM_LIBS)"; } >/dev/null 2>&1 & pin="$$($(TRITON_FOR_TORCH))" && \
	    { $(UV_INSTALL) $${pin:+"$$pin"} -e ".[dev]" || $(PIP_INSTALL) $$($(NO_ISOLATION)) $${pin:+"$$pin"} -e ".[dev]"; }; \
	    status=$$?; [ $$status != 0 ] || { $(WARM) "$(WARM_TOOLS)" && $(WARM_TESTS); } >/dev/null 2>&1; wait; exit $$status
	mkdir -p $(@D) && touch $@

setup: $(VENV)/.installed

# CELL_TIMEOUT: twice the slowest cpu-profile cell measured (notebook 07's checkpointing sweep: 175 s on a 2-core EPYC
# at load 5-8; the whole notebook used 107 s of CPU); a kernel that dies fails its cell within seconds instead
CELL_TIMEOUT ?= 360

# TEST_WORKERS: pytest-xdist workers, each pinned to its own share of the cores (conftest.py), a file per worker at a
# time (a notebook's cells stay in order in one kernel). 2 on a CPU machine: one worker's launches, spawns and timeouts
# leave a core idle that the other uses.
TEST_WORKERS ?= $(if $(filter 1,$(HAS_CUDA)),$(GPU_WORKERS),2)
# With CUDA, a quarter of the cores, 1 to 4 (helpers.course.smoke_time.SMOKE_WORKERS): one worker's smoke run took
# about 10 minutes on an H200, over its 6-minute budget, and the cpu profile's sizes use a sliver of the card
GPU_WORKERS = $(shell n=$$(nproc); w=$$((n / 4)); echo $$((w < 1 ? 1 : w > 4 ? 4 : w)))
# TEST_TIMES: each test's (each notebook cell's) seconds as it finishes, one JSON line each (conftest.py)
TEST_TIMES ?= build/test_times.jsonl

# HELPERS_PROFILE=cpu: PROFILE="auto" means the cpu profile's sizes under make test, on a GPU too (fast: every cell
# fits the CPU's CELL_TIMEOUT; the device is still the GPU); the gpu profile's sizes are `make writeup PROFILE=gpu`'s
# and `make reference`'s. With CUDA, make test is the GPU smoke run: the notebooks and SMOKE_TESTS, the kernels
# compiled with the machine's own Triton (the rest of tests/ is the CPU's; TESTS=tests runs it too).
# TORCHINDUCTOR_VEC_ISA_OK=1: inductor takes the CPU's vector ISA from its flags instead of proving each by compiling
# a probe, once per cache folder (about 6 s of a cold cache's first compile on a 2-core EPYC): what it generates is
# the same, and `make writeup` still probes.
# HAS_CUDA: asked once, when first read (after setup has made .venv); helpers/pins.py answers for a CPU build of
# torch without importing it (seconds), and imports it to ask torch.cuda where the build has CUDA
HAS_CUDA = $(eval HAS_CUDA := $$(shell $(PY) helpers/pins.py --cuda))$(HAS_CUDA)
SMOKE_TESTS := $(KERNEL_TESTS) tests/test_gpu_setups.py
TESTS ?= $(if $(filter 1,$(HAS_CUDA)),$(SMOKE_TESTS),tests)

# --no-loadscope-reorder keeps conftest.py's longest-first order
test: setup
	rm -f $(TEST_TIMES)
	TORCHINDUCTOR_VEC_ISA_OK=1 HELPERS_TEST_TIMES=$(TEST_TIMES) \
	    HELPERS_BUDGET_SCALE=0.5 HELPERS_PROFILE=cpu $(PY) -m pytest -m "not ci" \
	    -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --nbval-lax --nbval-current-env \
	    --nbval-cell-timeout=$(CELL_TIMEOUT) $(TESTS) notebooks

# installed apart once per NEWEST_TRITON (its stamp names the version): pip --target reinstalls on every call (8 s)
NEWEST_STAMP = $(NEWEST_DIR)/.installed-$(subst triton==,,$(NEWEST_TRITON))
$(NEWEST_STAMP): | $(PY)
	rm -rf $(NEWEST_DIR)
	$(PIP_INSTALL) --no-deps --target $(NEWEST_DIR) "$(NEWEST_TRITON)"
	touch $@

# The kernel tests in the interpreter of NEWEST_TRITON, first on PYTHONPATH (CI runs it after make test; EXPECT_TRITON:
# test_kernels checks that the run imported the Triton it names); the compile check for the course's H100 alone
# (sm_80's registers and spills are the course's Triton's to answer for)
test-newest-triton: setup $(NEWEST_STAMP)
	EXPECT_TRITON=$(subst triton==,,$(NEWEST_TRITON)) PYTHONPATH=$(NEWEST_DIR) HELPERS_KERNEL_ARCHS=sm_90a \
	    $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -q -p no:cacheprovider $(NEWEST_TESTS)

# What CI runs after make test (.ci/run): the slow end-to-end checks marked `ci`, which make test leaves out (the
# kernels and two tuning-grid tiles compiled for sm_80 and sm_90a by Triton and ptxas; the compile cache's
# AVX2-then-native repro on an AVX-512 CPU; every check that drives headless Chromium, tests/browser.py: 74 s on a
# 2-core EPYC), then the kernel tests under the newest Triton
test-ci: setup
	$(PY) -m pytest -m ci -n $(TEST_WORKERS) --dist loadfile -q -p no:cacheprovider tests
	$(MAKE) --no-print-directory test-newest-triton

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

writeup: setup
	$(PY) -m helpers writeup --profile $(PROFILE) --budget $(BUDGET) --edition $(EDITION) \
		$(if $(strip $(ADAPTERS)),--adapters $(ADAPTERS))

lab: setup
	$(PY) -m jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

strip: setup
	$(PY) -m jupyter nbconvert --clear-output --inplace notebooks/*.ipynb

bench: setup
	set -e; for t in $(TOPICS); do echo "== bench $$t"; $(PY) -m helpers bench $$t; done

stress: setup
	OMP_NUM_THREADS=1 PYTHONPATH=. $(PY) tests/exit_stress.py --runs $(RUNS)

yours: setup
	$(if $(strip $(ADAPTERS)),,$(error set ADAPTERS=path/to/your/tests/adapters.py))
	$(PY) -m helpers yours $(ADAPTERS) --profile $(PROFILE) $(ARGS)
reference: setup
	$(PY) -m helpers reference --budget-s $(BUDGET_S) $(REFERENCE_ARGS)

wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --platform any -d $(WHEELS_DIR) -r requirements-notebook.txt

# What the GPU smoke run needs beyond the GPU image: pytest's notebook runner and a Jupyter kernel, and ipywidgets
# for the live cells (about 16 MB, not the 60 of `make wheels`: a lent machine carries at most 64 MiB; docs/gpu.md)
SMOKE_WHEELS := nbval nbformat fastjsonschema jsonschema jsonschema-specifications referencing rpds-py \
    jupyter-client jupyter-core platformdirs traitlets pyzmq tornado ipykernel comm debugpy ipython \
    ipython-pygments-lexers jedi parso matplotlib-inline pexpect ptyprocess prompt-toolkit wcwidth stack-data \
    executing asttokens pure-eval nest-asyncio2 ipywidgets widgetsnbextension jupyterlab-widgets einx frozendict
SMOKE_WHEELS_DIR ?= .whl

smoke-wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --platform any -d $(SMOKE_WHEELS_DIR) \
	    $$(for n in $(SMOKE_WHEELS); do grep -i "^$$n==" requirements-notebook.txt || echo "MISSING-$$n"; done)

# The smoke run on a lent GPU machine with no network (docs/gpu.md): the image's own Python, the smoke wheels carried
# in SMOKE_WHEELS_DIR and installed apart (SMOKE_SITE), no .venv; the same pytest line as `make test` on a GPU
SMOKE_SITE ?= /tmp/smoke-site
smoke-offline:
	$(PYTHON) -m pip install -q --no-index --no-deps --no-compile --target $(SMOKE_SITE) $(SMOKE_WHEELS_DIR)/*.whl
	PYTHONPATH=$(SMOKE_SITE):$(CURDIR) HELPERS_TEST_TIMES=$(TEST_TIMES) HELPERS_PROFILE=cpu $(PYTHON) -m pytest \
	    -n $(GPU_WORKERS) --dist loadfile --nbval-lax --nbval-current-env --nbval-cell-timeout=$(CELL_TIMEOUT) \
	    -p no:cacheprovider -rfE --durations=30 $(SMOKE_TESTS) notebooks

clean:
	rm -rf writeups data/local
