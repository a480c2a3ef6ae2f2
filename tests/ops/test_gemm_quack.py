"""quack's Hopper kernels as mm and addmm candidates (ops/gemm/quack_candidates.py, backends/quack.py,
backends/quack_build.py): what supports refuses and why (on the CPU, before any CUDA call), a missing
quack-kernels, kernels keyed by class not size, built by one child per batch (a fake builder: its errors
named), loaded once and from kept builds only under builds_only, the launch recipe's round trip, their
place after the Triton candidates; on an H100 / H200 with quack-kernels installed, each configuration run
directly against a float64 reference (mm and linear's addmm, every activation, row- and column-major
operands, float16 and bfloat16, NaN-filled out, a new result), a kernel built and loaded on a worker
thread with quack never imported here, torch's current stream, NaN / inf, and a CUDA graph of calls with
different biases."""

import concurrent.futures
import os
import stat
import sys
import time

import pytest
import torch

from gemm_checks import bound, check, check_graph_of_two_calls, matrix, nans, randn, within
from tunekit.backends import cache as cache_module, quack
from tunekit.ops.gemm import AddmmParams, GemmParams, addmm_op, mm_op
from tunekit.ops.gemm.quack_candidates import CONFIGS, MIN_MN, QuackGemm, _bias_problem, _operand_problem
from tunekit.tunable.preparations import NeedsCompiler, builds_only

NAMES = [QuackGemm(c).name for c in CONFIGS]


def _linear(M, N, K, dtype, device, act="none", bias=True, b_layout="col", out=True, seed=0, a_layout="row"):
    a = matrix(M, K, dtype, device, a_layout, seed=seed)
    b = matrix(K, N, dtype, device, b_layout, seed=seed + 1)  # "col": weight.t()
    o = nans((M, N), dtype, device) if out else None
    if not bias:
        return GemmParams(a, b, o, activation=act)
    return AddmmParams(randn((N,), dtype, device, seed=seed + 2), a, b, out=o, activation=act)


def test_every_configuration_is_a_candidate_of_both_ops_after_the_triton_ones():
    assert len(set(NAMES)) == len(CONFIGS)
    for op in (mm_op, addmm_op):
        names = [c.name for c in op.candidates]
        assert names[-len(NAMES):] == NAMES  # online tuning's cap of compiles is spent on Triton first
        assert all(callable(getattr(op.candidate(n), "prepare", None)) for n in NAMES)
    assert mm_op.candidate(NAMES[0]) is not addmm_op.candidate(NAMES[0])
    assert len({QuackGemm(c).source_hash() for c in CONFIGS}) == len(CONFIGS)


def test_cpu_tensors_and_unknown_activations_are_declined():
    c = QuackGemm(CONFIGS[0])
    assert c.supports(_linear(1024, 1024, 64, torch.bfloat16, "cpu")) == "CUDA only"
    assert "activation" in c.supports(_linear(1024, 1024, 64, torch.bfloat16, "cpu", act="gelu"))  # erf: not quack's


def test_other_scalars_in_the_same_cache_key_get_torchs_addmm():
    """A choice made for linear's form (alpha = beta = 1) met by other scalars of the same cache key."""
    p = _linear(1024, 1024, 64, torch.float32, "cpu")
    q = AddmmParams(p.c, p.a, p.b, alpha=0.5, beta=2.0)
    check(QuackGemm(CONFIGS[0]).run(q), q.a, q.b, q.c, alpha=0.5, beta=2.0)


def test_what_is_refused_before_any_cuda_call():
    bf = torch.bfloat16
    assert _operand_problem(_linear(1024, 1024, 64, bf, "cpu")) is None
    assert _bias_problem(_linear(1024, 1024, 64, bf, "cpu")) is None
    assert "float16 / bfloat16" in _operand_problem(_linear(1024, 1024, 64, torch.float32, "cpu"))
    assert "multiples of 8" in _operand_problem(_linear(1024, 1024, 60, bf, "cpu"))
    assert "multiples of 8" in _operand_problem(_linear(1024, 1020, 64, bf, "cpu"))
    assert f"{MIN_MN} or more" in _operand_problem(_linear(512, 1024, 64, bf, "cpu"))
    assert "dense" in _operand_problem(_linear(1024, 1024, 64, bf, "cpu", b_layout="ld"))
    assert "dense" in _operand_problem(_linear(1024, 1024, 64, bf, "cpu", b_layout="misaligned"))
    p = _linear(1024, 1024, 64, bf, "cpu")
    p.out = nans((1024, 1024), bf, "cpu").t()
    assert "out:" in _operand_problem(p)
    p = _linear(1024, 1024, 64, bf, "cpu")
    assert "alpha = beta = 1" in _bias_problem(AddmmParams(p.c, p.a, p.b, alpha=2))
    assert "bias" in _bias_problem(AddmmParams(randn((1024, 1024), bf), p.a, p.b))
    assert "bias" in _bias_problem(AddmmParams(p.c.float(), p.a, p.b))
    assert _bias_problem(AddmmParams(p.c.view(1, 1024), p.a, p.b)) is None  # a [1, N] bias
    assert "16-byte aligned" in _bias_problem(AddmmParams(randn((1025,), bf)[1:], p.a, p.b))
    assert "empty" in _operand_problem(_linear(1024, 1024, 0, bf, "cpu"))


def test_a_missing_quack_is_the_reason(monkeypatch):
    monkeypatch.setattr(quack.importlib.metadata, "version", lambda name: (_ for _ in ()).throw(
        quack.importlib.metadata.PackageNotFoundError(name)))
    quack.version.cache_clear()
    quack.unavailable.cache_clear()
    try:
        assert "not installed" in quack.unavailable(0)
    finally:
        quack.version.cache_clear()
        quack.unavailable.cache_clear()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty tunekit cache, and a GPU model for the kernels' keys (on the CPU)."""
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(quack, "_environment", lambda index: "test-gpu")
    monkeypatch.setattr(quack, "_kernels", {})
    monkeypatch.setattr(quack, "_failed", {})
    return tmp_path / "cache" / "quack"


def _spec(p, config=CONFIGS[0]):
    return quack.spec_for(p.a, p.b, getattr(p, "c", None), p.activation, config)


def test_a_kernels_key_names_its_class_not_its_sizes(cache):
    bf = torch.bfloat16
    keys = {_spec(_linear(1024, 1024, 64, bf, "cpu", "gelu_tanh"))["key"],
            _spec(_linear(2048, 4096, 512, bf, "cpu", "gelu_tanh"))["key"]}
    assert len(keys) == 1  # one kernel serves every shape of its class
    others = [_spec(_linear(1024, 1024, 64, torch.float16, "cpu", "gelu_tanh")),
              _spec(_linear(1024, 1024, 64, bf, "cpu", "relu")),
              _spec(_linear(1024, 1024, 64, bf, "cpu", "gelu_tanh", b_layout="row")),
              _spec(_linear(1024, 1024, 64, bf, "cpu", "gelu_tanh", a_layout="col")),
              _spec(_linear(1024, 1024, 64, bf, "cpu", "gelu_tanh", bias=False)),
              _spec(_linear(1024, 1024, 64, bf, "cpu", "gelu_tanh"), CONFIGS[1])]
    assert len(keys | {s["key"] for s in others}) == 1 + len(others)
    spec = others[1]
    assert (spec["quack_activation"], spec["a_major"], spec["b_major"], spec["bias"]) == ("relu", "row", "col", True)


def test_a_kernel_not_built_yet_needs_a_compiler_under_kept_builds_only(cache, monkeypatch):
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu")
    monkeypatch.setattr(quack, "build", lambda specs: pytest.fail("built under builds_only"))
    with builds_only(), pytest.raises(NeedsCompiler):
        quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0])


def test_a_kernel_built_before_loads_under_kept_builds_only_once_per_process(cache, monkeypatch):
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu", "gelu_tanh")
    key = _spec(p)["key"]
    (cache / key).mkdir(parents=True)
    (cache / key / "kernel.so").write_bytes(b"")
    loaded = []
    monkeypatch.setattr(quack, "QuackKernel", lambda folder: loaded.append(folder) or object())
    with builds_only():
        first = quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0])
    assert quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0]) is first and loaded == [cache / key]


def _builder(tmp_path, monkeypatch, body):
    script = tmp_path / "fake_build.py"
    script.write_text("import json, os, sys\nroot = sys.argv[1]\nspecs = json.loads(sys.stdin.read())\n" + body)
    monkeypatch.setattr(quack, "_BUILDER", script)


def test_a_failed_build_says_why_and_is_not_tried_again(cache, tmp_path, monkeypatch):
    _builder(tmp_path, monkeypatch, "open(os.path.join(root, 'children.log'), 'a').write('child\\n')\n"
                                    "for s in specs: print(json.dumps({'key': s['key'], 'error': 'ptxas: boom'}))\n"
                                    "sys.exit(1)\n")
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu")
    for _ in range(2):  # the second time from memory: no child
        with pytest.raises(RuntimeError, match="ptxas: boom"):
            quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0])
    assert (cache / "children.log").read_text().split() == ["child"]
    _builder(tmp_path, monkeypatch, "sys.stderr.write('Traceback: no module quack'); sys.exit(1)\n")
    with pytest.raises(RuntimeError, match="no module quack"):  # a child that died: its last words
        quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[1])


def test_a_build_past_its_time_is_stopped(cache, tmp_path, monkeypatch):
    _builder(tmp_path, monkeypatch, "import time; time.sleep(60)\n")
    monkeypatch.setattr(quack, "BUILD_TIMEOUT_S", 1)
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu")
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="took over 1 s"):
        quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0])
    assert time.perf_counter() - t0 < 30 and not quack._children


WRITES_A_KERNEL = ("for s in specs:\n"
                   "    open(os.path.join(root, 'children.log'), 'a').write(s['key'] + '\\n')\n"
                   "    import time; time.sleep(0.3)\n"
                   "    d = os.path.join(root, s['key']); os.makedirs(d, mode=0o700)\n"
                   "    for n, t in (('kernel.so', ''), ('recipe.json', '[]'), ('libs.json', LIBS)):\n"
                   "        open(os.path.join(d, n), 'w').write(t); os.chmod(os.path.join(d, n), MODE)\n")


def test_one_build_per_kernel_across_threads(cache, tmp_path, monkeypatch):
    _builder(tmp_path, monkeypatch, "LIBS, MODE = '[]', 0o600\n" + WRITES_A_KERNEL)
    monkeypatch.setattr(quack, "QuackKernel", lambda folder: object())
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu", "gelu_tanh")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        kernels = list(pool.map(lambda _: quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0]), range(4)))
    assert len({id(k) for k in kernels}) == 1 and (cache / "children.log").read_text().split() == [_spec(p)["key"]]


@pytest.mark.parametrize("mode, libs, why", [
    (0o664, "[]", "writable by others"),  # built under umask 002 before the builder made its files private
    (0o600, '["/tmp/evil/libpwn.so"]', "names libraries other than"),
])
def test_a_kernel_that_is_not_private_or_names_other_libraries_is_not_loaded(cache, tmp_path, monkeypatch, mode,
                                                                               libs, why):
    _builder(tmp_path, monkeypatch, f"LIBS, MODE = {libs!r}, {mode}\n" + WRITES_A_KERNEL)
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu", "gelu_tanh")
    with pytest.raises((cache_module.UntrustedCache, ValueError), match=why):
        quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0])
    assert "libpwn" not in str(quack._libraries)


def test_a_kernel_built_before_that_does_not_load_is_built_again_once(cache, tmp_path, monkeypatch):
    """A moved environment's library paths, a damaged file: built again, once."""
    _builder(tmp_path, monkeypatch, "LIBS, MODE = '[]', 0o600\n" + WRITES_A_KERNEL)
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu", "gelu_tanh")
    quack.build([_spec(p)])
    loads = []

    def load(folder):
        loads.append(folder)
        if len(loads) == 1:
            raise OSError("libcute_dsl_runtime.so: cannot open shared object file")
        return object()
    monkeypatch.setattr(quack, "QuackKernel", load)
    quack.kernel_for(p.a, p.b, p.c, "gelu_tanh", CONFIGS[0])
    assert len(loads) == 2 and (cache / "children.log").read_text().split() == [_spec(p)["key"]] * 2


def test_the_builder_makes_its_files_private_whatever_the_umask(tmp_path):
    from tunekit.backends import quack_build

    old = os.umask(0o002)
    try:
        folder = tmp_path / "k"
        folder.mkdir()
        (folder / "kernel.so").write_bytes(b"")
    finally:
        os.umask(old)
    quack_build.private(str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE((folder / "kernel.so").stat().st_mode) == 0o600


def test_one_child_builds_the_kernels_not_built_yet(cache, tmp_path, monkeypatch):
    _builder(tmp_path, monkeypatch, "for s in specs:\n    os.makedirs(os.path.join(root, s['key']))\n"
                                    "    open(os.path.join(root, s['key'], 'kernel.so'), 'w').close()\n"
                                    "    open(os.path.join(root, 'built.log'), 'a').write(s['key'] + '\\n')\n")
    p = _linear(1024, 1024, 64, torch.bfloat16, "cpu")
    specs = [_spec(p, c) for c in CONFIGS[:3]]
    quack.build(specs[:1])
    quack.build(specs)
    assert (cache / "built.log").read_text().split() == [s["key"] for s in specs]


def test_a_launch_recipe_round_trip():
    """The child describes the launch's arguments by the call's tensors and literals (an H100's recipe:
    A, B, no D or C, the epilogue's bias and output, the scheduler's cluster count); the parent rebuilds
    them for other tensors, constants built once."""
    from tunekit.backends import quack_build

    class Int32:  # the CuTe DSL's numeric wrapper
        def __int__(self):
            return 66

    a, b, bias, out = torch.randn(8, 4), torch.randn(6, 4).t(), torch.randn(6), torch.empty(8, 6)
    named = {"a": a, "b": b, "bias": bias, "out": out}
    launch = (a, b.mT, None, None, (bias, out, None, None), (Int32(), None, 8, None, None, None), None, None, None)
    recipe = [quack_build._describe(v, named) for v in launch]
    assert recipe[1] == {"t": "b", "mT": True} and recipe[5]["tuple"][0] == {"v": 66}
    make = quack.arguments(recipe)
    a2, b2, bias2, out2 = torch.randn(16, 4), torch.randn(2, 4).t(), torch.randn(2), torch.empty(16, 2)
    args = make({"a": a2, "b": b2, "bias": bias2, "out": out2})
    assert args[0] is a2 and args[1].data_ptr() == b2.data_ptr() and args[1].shape == (2, 4)
    assert args[4][0] is bias2 and args[4][1] is out2 and args[5] == (66, None, 8, None, None, None)
    assert make({"a": a2, "b": b2, "bias": bias2, "out": out2})[5] is args[5]
    with pytest.raises(ValueError, match="does not give"):
        quack_build._describe(torch.randn(3), named)
    with pytest.raises(ValueError, match="neither a tensor nor a literal"):
        quack_build._describe(object(), named)


# -- on an H100 / H200 with quack-kernels -----------------------------------------------------------
def _offered(c, p):
    why = c.supports(p)
    if why is not None and ("not installed" in why or "compute capability" in why):
        pytest.skip(why)
    assert why is None, f"{c.name}: {why}"
    return c


def _check_like_torch(out, p, act):
    """Within the bound of a single-rounding float32-accumulating GEMM, or no further off than torch's
    own (add)mm + activation on the same inputs where torch misses that bound."""
    c = p.c if type(p) is AddmmParams else None
    ref, allowed = bound(p.a, p.b, c, act=act, out_dtype=out.dtype)
    theirs = (addmm_op if c is not None else mm_op).default.run(type(p)(*((c,) if c is not None else ()), p.a, p.b,
                                                                        activation=act)).double()
    finite = ref.isfinite() & theirs.isfinite()
    slack = max(1.0, float(((theirs - ref).abs() / allowed)[finite].max())) if finite.any() else 1.0
    within(out, ref, allowed * slack)


FORMS = [("gelu_tanh", True, torch.bfloat16, "col"), ("none", False, torch.float16, "row"),
         ("none", True, torch.bfloat16, "col"), ("relu", True, torch.float16, "col"),
         ("silu", True, torch.bfloat16, "row"), ("gelu_tanh", False, torch.bfloat16, "col")]


CASES = [(n, *f) for n in NAMES for f in (FORMS if n == NAMES[0] else FORMS[:2])]


@pytest.fixture(scope="module", autouse=True)
def fresh_cache(tmp_path_factory):
    """This module's GPU tests build into a cache of their own: every kernel built here, none found."""
    old = os.environ.get("TUNEKIT_CACHE")
    os.environ["TUNEKIT_CACHE"] = str(tmp_path_factory.mktemp("tunekit_cache"))
    yield
    if old is None:
        del os.environ["TUNEKIT_CACHE"]
    else:
        os.environ["TUNEKIT_CACHE"] = old


@pytest.fixture(scope="module")
def built():
    """The kernels of the tests below (not the worker thread's: it builds its own), built side by side in
    eight child processes: one by one, each costs quack's import and a compile of seconds."""
    if not torch.cuda.is_available() or quack.unavailable(torch.cuda.current_device()):
        return
    specs = []
    for name, act, bias, dtype, b_layout in CASES + [(NAMES[-1], "relu", True, torch.bfloat16, "col")]:
        p = _linear(16, 16, 16, dtype, "cuda", act, bias, b_layout)
        specs.append(quack.spec_for(p.a, p.b, getattr(p, "c", None), act, CONFIGS[NAMES.index(name)]))
    for b_layout in ("row", "col"):
        p = _linear(16, 16, 16, torch.bfloat16, "cuda", bias=False, b_layout=b_layout, a_layout="col")
        specs.append(quack.spec_for(p.a, p.b, None, "none", CONFIGS[0]))
    quack.build(specs, processes=8)


@pytest.mark.gpu
@pytest.mark.parametrize("name, act, bias, dtype, b_layout", CASES)
def test_each_configuration_directly(built, name, act, bias, dtype, b_layout):
    """Every form on the first configuration, two on the others (each form and configuration is a compile
    of seconds)."""
    p = _linear(1032, 1544, 520, dtype, "cuda", act, bias, b_layout, seed=len(name))  # multiples of 8, not of 16
    c = _offered(QuackGemm(CONFIGS[NAMES.index(name)]), p)
    c.prepare(p)  # the plan, compiled without a launch
    assert c.run(p) is p.out
    _check_like_torch(p.out, p, act)
    fresh = _linear(2048, 1024, 1024, dtype, "cuda", act, bias, b_layout, out=False, seed=7)  # same plan, other sizes
    _check_like_torch(c.run(fresh), fresh, act)


@pytest.mark.gpu
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_a_column_major_a_as_the_weight_gradient_has(built, b_layout):
    """grad_weight = grad_out.T @ x: A column-major (M-contiguous), a plan of its own."""
    p = _linear(1024, 2048, 512, torch.bfloat16, "cuda", bias=False, b_layout=b_layout, seed=5, a_layout="col")
    c = _offered(QuackGemm(CONFIGS[0]), p)
    assert c.run(p) is p.out
    _check_like_torch(p.out, p, "none")


@pytest.mark.gpu
def test_a_kernel_is_built_and_loaded_on_a_worker_thread_as_preparations_are_and_quack_is_never_imported():
    """Built by a child process (this form is none of ``built``'s), loaded on a worker thread, run on this
    one; this process never imports quack or the CuTe DSL (their import froze the process for seconds)."""
    import concurrent.futures
    p = _linear(1024, 1024, 256, torch.float16, "cuda", "gelu_tanh", seed=3)
    c = _offered(QuackGemm(CONFIGS[2]), p)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(c.prepare, p).result(timeout=600)
    _check_like_torch(c.run(p), p, "gelu_tanh")
    assert not [m for m in sys.modules if m.split(".")[0] in ("quack", "cutlass")]


@pytest.mark.gpu
def test_a_call_runs_on_the_current_stream(built):
    """The kernel takes torch's current stream (TVM-FFI's environment stream): on a side stream, after a
    long sleep and a copy of new values into A there, it reads the new values (on any other stream it
    would have run during the sleep, on the old ones)."""
    p = _linear(1024, 1024, 512, torch.bfloat16, "cuda", "gelu_tanh", seed=4)
    c = _offered(QuackGemm(CONFIGS[0]), p)
    c.prepare(p)
    new_a = randn(p.a.shape, p.a.dtype, "cuda", seed=11)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        p.a.copy_(new_a)
        assert c.run(p) is p.out
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _check_like_torch(p.out, p, "gelu_tanh")


@pytest.mark.gpu
def test_nan_and_inf_land_where_torchs_do(built):
    p = _linear(1024, 1024, 64, torch.bfloat16, "cuda", "gelu_tanh")
    p.a[3, 5], p.a[7, 1], p.b[2, 9], p.c[11] = float("nan"), float("inf"), float("-inf"), float("nan")
    check(_offered(QuackGemm(CONFIGS[0]), p).run(p), p.a, p.b, p.c, act="gelu_tanh")


@pytest.mark.gpu
def test_a_cuda_graph_whose_calls_carry_different_biases(built):
    p1 = _linear(1024, 1024, 512, torch.bfloat16, "cuda", "relu", out=False, seed=1)
    p2 = AddmmParams(randn((1024,), torch.bfloat16, "cuda", seed=9), p1.a, p1.b, activation="relu")
    check_graph_of_two_calls(_offered(QuackGemm(CONFIGS[-1]), p1), p1, p2, "relu")
