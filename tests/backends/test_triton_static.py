"""Triton kernels launched without Triton (backends/triton_static.py): what a kept kernel is keyed by,
what its recipe holds, that a recipe is checked against its cubin, where kept files are found, and
the launch's choice between a kept kernel and Triton. The launches themselves: the GPU tests below."""

import ast
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from tunekit.backends import triton as triton_backend, triton_static
from tunekit.backends.triton_kept_files import Recipe, cubin_name
from tunekit.tunable.preparations import NeedsCompiler, builds_only

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def fake_compiled(signature: dict, **metadata):
    md = dict(name="k", num_warps=4, shared=0, num_ctas=1, launch_pdl=False, launch_cooperative_grid=False,
              global_scratch_size=0, profile_scratch_size=0, tensordesc_meta=[])
    md.update(metadata)
    return types.SimpleNamespace(metadata=types.SimpleNamespace(**md), src=types.SimpleNamespace(signature=signature),
                                 asm={"cubin": b"\x7fELF-cubin"}, function=0)


# -- keys ----------------------------------------------------------------------------------------------
def test_a_key_holds_every_scalar_by_type_and_value():
    keys = {triton_static.call_key((v,), {}) for v in (1, 1.0, True, 2, None, "s")}
    assert len(keys) == 6  # 1, 1.0 and True are equal in Python, never as keys here
    assert triton_static.call_key((16,), {"BLOCK": 64}) != triton_static.call_key((16,), {"BLOCK": 128})
    assert triton_static.call_key((0.0,), {}) != triton_static.call_key((-0.0,), {})  # a constexpr of either differs
    assert triton_static.call_key((float("nan"),), {}) == triton_static.call_key((float("nan"),), {})


def test_a_key_refuses_what_it_cannot_describe():
    for arg in (torch.empty(4), (1, 2), object()):  # a CPU tensor (the interpreter's), a tuple, anything else
        with pytest.raises(triton_static.NotStatic):
            triton_static.call_key((arg,), {})


# -- recipes -------------------------------------------------------------------------------------------
def test_a_recipe_names_the_arguments_each_parameter_comes_from():
    sig = {"x_ptr": "*fp32", "out_ptr": "*bf16", "n": "i32", "stride": "constexpr", "eps": "fp32", "big": "i64",
           "BLOCK": "constexpr"}
    x, out = torch.empty(4), torch.empty(4, dtype=torch.bfloat16)
    compiled = fake_compiled(sig, shared=1024, global_scratch_size=128)
    r = triton_static.recipe_of(list(sig), compiled, (x, out, 7, 1), {"eps": 1e-6, "big": 2**40, "BLOCK": 64})
    assert r == Recipe("k", 4, 1024, 128, (0, 1, 2, "eps", "big"), (8, 8, 4, 4, 8), cubin_name(compiled.asm["cubin"]))
    assert Recipe.from_json(r.to_json()) == r


def test_a_value_the_launch_would_pack_otherwise_than_triton_gets_no_recipe():
    """An int given to a parameter Triton typed fp32 (an annotation) would be packed as an integer."""
    sig = {"x_ptr": "*fp32", "scale": "fp32"}
    why = triton_static.recipe_of(list(sig), fake_compiled(sig), (torch.empty(1), 2), {})
    assert "given a int" in why
    assert "given a str" in triton_static.recipe_of(list(sig), fake_compiled(sig), ("x", 2.0), {})


@pytest.mark.parametrize("signature, metadata, why", [
    ({"a": "*fp32", "b": "fp16"}, {}, "type fp16"),
    ({"a": "*fp32", "b": "i32"}, {"num_ctas": 2}, "clusters"),
    ({"a": "*fp32", "b": "i32"}, {"launch_pdl": True}, "dependent launch"),
    ({"a": "*fp32", "b": "i32"}, {"profile_scratch_size": 64}, "profile scratch"),
    ({"a": "*fp32", "b": "i32"}, {"tensordesc_meta": [{}]}, "tensor descriptors"),
    ({"a": "*fp32", "c": "i32"}, {}, "parameters differ"),
])
def test_kernels_triton_launches_otherwise_get_no_recipe(signature, metadata, why):
    assert why in triton_static.recipe_of(["a", "b"], fake_compiled(signature, **metadata), (torch.empty(1), 3), {})


def test_a_parameter_left_to_its_default_gets_no_recipe():
    sig = {"a": "*fp32", "n": "i32"}
    assert "default" in triton_static.recipe_of(["a", "n"], fake_compiled(sig), (torch.empty(1),), {})


class FakeDriver:
    """cuFuncGetParamInfo of one kernel whose parameters have ``sizes``."""

    def __init__(self, sizes):
        self.sizes = sizes

    def cuFuncGetParamInfo(self, function, index):
        return (0, 8 * index, self.sizes[index]) if index < len(self.sizes) else (1, 0, 0)


@pytest.mark.parametrize("cubin_sizes, extras", [
    ([8, 8, 4, 8, 8], 2),  # Triton 3.5+: global and profile scratch pointers
    ([8, 8, 4, 8], 1),  # Triton 3.3-3.4: global scratch only
    ([8, 8, 4], None),  # no scratch pointer: not the launch the recipe knows
    ([8, 4, 4, 8, 8], None),  # a parameter of another size
    ([8, 8, 4, 8, 8, 8], None),  # more trailing parameters than Triton adds
    ([8, 8, 4, 8, 4], None),
])
def test_a_recipe_launches_only_a_cubin_whose_parameters_it_matches(monkeypatch, cubin_sizes, extras):
    monkeypatch.setattr(triton_static, "libcuda", lambda: FakeDriver(cubin_sizes))
    recipe = Recipe("k", 8, 0, 0, (0, 1, 2), (8, 8, 4))
    fit = triton_static._fit(0x1234, recipe)
    assert (fit.extras, fit.block, fit.function) == (extras, 256, 0x1234) if extras else fit is None


def test_the_ctypes_launch_packs_as_the_c_extension_does():
    """What runs while the C extension builds: the same slots (None, float32 bits, ints, addresses)."""
    import struct

    from launch_recorder import RecordingDriver

    x = torch.randn(8)
    driver = RecordingDriver(n_args=5)
    triton_static.ctypes_launch(0xBEEF, 3, 2, 5, 128, 4096, 0x7000, x, None, 1.5, -3, 1 << 40,
                                entry=triton_static._LAUNCH(driver.address))
    (call,) = driver.calls
    assert call["grid"] == (3, 2, 5) and call["block"] == (128, 1, 1) and call["shared"] == 4096
    assert call["values"] == [x.data_ptr(), 0, struct.unpack("<I", struct.pack("<f", 1.5))[0], 2**64 - 3, 1 << 40]
    failing = RecordingDriver(n_args=1, result=700)
    with pytest.raises(RuntimeError, match="CUresult 700"):
        triton_static.ctypes_launch(1, 1, 1, 1, 32, 0, 0, 7, entry=triton_static._LAUNCH(failing.address))


# -- the launch's choice -------------------------------------------------------------------------------
@pytest.fixture
def kept(monkeypatch):
    """triton_static as if enabled, with ``found`` (a dict the test fills: (name) -> kept or None)."""
    found = {}
    monkeypatch.setattr(triton_static, "enabled", lambda: True)
    monkeypatch.setattr(triton_static, "load", lambda module, name, args, kwargs, index=None: found.get(name))
    monkeypatch.setattr(triton_static, "launch", lambda module, name, grid, args, kwargs: found.get(name) is not None)

    def no_triton(self):
        raise AssertionError("Triton was reached")
    monkeypatch.setattr(triton_backend.KernelRef, "resolve", no_triton)
    return found


def test_kept_kernels_launch_and_warm_up_without_reaching_triton(kept):
    kept["k"] = object()
    ref = triton_backend.KernelRef("logsumexp", "k")
    triton_backend.launch(ref, (1,), 1, BLOCK=2)
    with triton_backend.warming(), builds_only():
        triton_backend.launch(ref, (1,), 1, BLOCK=2)


def test_a_warm_up_for_kept_builds_only_raises_where_triton_would_compile(kept):
    with triton_backend.warming(), builds_only(), pytest.raises(NeedsCompiler, match="k2"):
        triton_backend.launch(triton_backend.KernelRef("logsumexp", "k2"), (1,), 1)
    with pytest.raises(AssertionError, match="Triton was reached"):  # compilers allowed: Triton's turn
        with triton_backend.warming():
            triton_backend.launch(triton_backend.KernelRef("logsumexp", "k2"), (1,), 1)


def test_a_warm_up_for_kept_builds_only_never_compiles_even_with_kept_launches_off(monkeypatch):
    monkeypatch.setattr(triton_static, "enabled", lambda: False)

    def no_triton(self):
        raise AssertionError("Triton was reached")
    monkeypatch.setattr(triton_backend.KernelRef, "resolve", no_triton)
    with triton_backend.warming(), builds_only(), pytest.raises(NeedsCompiler):
        triton_backend.launch(triton_backend.KernelRef("logsumexp", "k"), (1,), 1)


def test_recording_never_raises(monkeypatch):
    """Arguments no key describes are left to Triton silently; anything else failing (here: no CUDA
    device, or Triton's objects not as expected) is one warning, never the caller's exception."""
    warned = []
    monkeypatch.setattr(triton_static, "warn_once", lambda key, message: warned.append(message))
    triton_static.record("logsumexp", "k", ["x"], object(), (torch.empty(4),), {})  # a CPU tensor: NotStatic
    assert warned == []
    triton_static.record("logsumexp", "k", ["n"], object(), (3,), {})
    assert len(warned) == 1 and "through Triton" in warned[0]


def test_kernel_names_jit_functions_without_importing_triton():
    if triton_backend.kernel("logsumexp", "logsumexp_rows_kernel") is None:
        pytest.skip("needs Triton")
    code = ("import sys; from tunekit.backends import triton as t; "
            "r = t.kernel('logsumexp', 'logsumexp_rows_kernel'); a = t.kernel('gemm', 'ACTIVATIONS'); "
            "print(type(r).__name__, a['gelu'], 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split() == ["KernelRef", "3", "False"]


def test_kernel_names_jit_functions_and_reads_literal_constants():
    ref = triton_backend.kernel("logsumexp", "logsumexp_rows_kernel")
    if ref is None:
        pytest.skip("needs Triton")
    assert ref == triton_backend.KernelRef("logsumexp", "logsumexp_rows_kernel")
    assert triton_backend._jit_names("gemm") >= {"matmul_kernel", "splitk_reduce_kernel", "matmul_skinny_kernel"}
    assert "ACTIVATIONS" not in triton_backend._jit_names("gemm")
    assert isinstance(triton_backend.kernel("gemm", "ACTIVATIONS"), dict)  # not a kernel: the attribute


def _jit_names_by_ast(text: str) -> frozenset[str]:
    names = set()
    for node in ast.parse(text).body:
        for d in getattr(node, "decorator_list", ()):
            d = d.func if isinstance(d, ast.Call) else d
            if ast.unparse(d) in ("triton.jit", "jit"):
                names.add(node.name)
    return frozenset(names)


@pytest.mark.parametrize("path", sorted(triton_static.KERNELS_DIR.glob("*.py")), ids=lambda p: p.stem)
def test_the_jit_names_read_by_pattern_are_those_the_syntax_tree_gives(path):
    """The regular expression of ``_jit_names`` against a full parse, on every kernels module."""
    assert triton_backend._jit_names(path.stem) == _jit_names_by_ast(path.read_text())


def test_the_jit_pattern_reads_decorators_with_arguments_and_stacked_ones():
    text = ("@triton.jit\ndef a(x):\n    pass\n\n@jit(do_not_specialize=[1])\n@other\ndef b(x):\n    pass\n\n"
            "@other\ndef c(x):\n    pass\n\ndef d():\n    x = '@triton.jit'\n")
    assert triton_backend._JIT_DEF.findall(text) == ["a", "b"]
    assert _jit_names_by_ast(text) == {"a", "b"}


# -- on the GPU ----------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.gpu
def test_a_kept_kernel_gives_tritons_bits_and_a_new_process_runs_it_without_triton(tmp_path):
    """logsumexp's rows kernel (on an aligned and a misaligned input), the GEMM pointer kernel and the
    persistent TMA GEMM (global scratch): the first call through Triton, the next through the kept
    cubin, bit for bit; then a fresh process with the same cache launches them without importing
    Triton (but for the TMA kernel, whose launcher imports it)."""
    env = {**os.environ, "TUNEKIT_CACHE": str(tmp_path / "cache"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "TUNEKIT_USE_SHIPPED": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    script = os.path.join(os.path.dirname(__file__), "triton_static_scenario.py")
    first = json.loads(subprocess.run([sys.executable, script], env=env, check=True, capture_output=True,
                                      text=True).stdout.splitlines()[-1])
    assert first["same"] and first["kept"] == first["kernels"] and first["triton_imported"], first
    second = json.loads(subprocess.run([sys.executable, script], env=env, check=True, capture_output=True,
                                       text=True).stdout.splitlines()[-1])
    assert second["same"] and second["kept"] == second["kernels"] and not second["triton_imported"], second
    assert second["digest"] == first["digest"]
    # four keys (the misaligned input is one of its own), their cubins stored once per content: on the
    # H100 the two logsumexp keys compiled to the same bytes (777 columns: no aligned access to gain)
    assert 1 <= first["cubins"] <= first["kept"], first


# -- recording launches (ops/gemm/launch_plans.py replays them from C++) --------------------------------
@pytest.fixture
def one_kept(monkeypatch):
    """A kept kernel "k" (4 warps, 1 KB shared, 16 bytes of scratch per program, parameters x and n,
    Triton's two scratch pointers), found on a fake device 0; launches made are collected."""
    loaded = triton_static._Loaded(0xABC, Recipe("k", 4, 1024, 16, (0, "n"), (8, 4)), 128, 2)
    made = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(triton_static, "load", lambda module, name, args, kwargs, index=None: loaded if name == "k" else None)
    monkeypatch.setattr(triton_static, "_launcher", lambda: lambda *args: made.append(args))
    monkeypatch.setattr(triton_static, "raw_stream", lambda index: 0)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *sizes, device=None, **kw: empty(*sizes, **kw))  # no device 0 here
    return made


def test_launches_inside_recording_are_recorded_not_made(one_kept):
    x = torch.randn(4)
    with triton_static.recording() as launches:
        assert triton_static.launch("gemm", "k", (3, 2), (x,), {"n": 5}) is True
        assert triton_static.launch("gemm", "k", (0,), (x,), {"n": 5}) is True  # an empty grid: nothing
        assert triton_static.is_recording()
    assert launches == [(0xABC, (3, 2, 1), 128, 1024, 3 * 2 * 16, [x, 5, triton_static.SCRATCH, None])]
    assert one_kept == [] and not triton_static.is_recording()
    assert triton_static.launch("gemm", "k", (3, 2), (x,), {"n": 5}) is True  # outside: launched
    (made,) = one_kept
    assert made[:7] == (0xABC, 3, 2, 1, 128, 1024, 0) and made[7] is x and made[8] == 5
    assert made[9].numel() == 3 * 2 * 16 and made[10] is None  # the scratch, allocated per launch


def test_a_launch_only_triton_can_make_refuses_inside_recording(one_kept, monkeypatch):
    x = torch.randn(4)
    assert triton_static.launch("gemm", "other", (1,), (x,), {}) is False  # outside: Triton's turn
    with triton_static.recording(), pytest.raises(triton_static.NotStatic, match="no kept kernel"):
        triton_static.launch("gemm", "other", (1,), (x,), {})
    with triton_static.recording(), pytest.raises(triton_static.NotStatic):
        triton_static.launch("gemm", "k", lambda meta: (1,), (x,), {"n": 5})  # a grid function
    monkeypatch.setattr(triton_static, "enabled", lambda: False)  # kept launches off: Triton would launch

    def no_triton(self):
        raise AssertionError("Triton was reached")
    monkeypatch.setattr(triton_backend.KernelRef, "resolve", no_triton)
    with triton_static.recording(), pytest.raises(triton_static.NotStatic, match="through Triton"):
        triton_backend.launch(triton_backend.KernelRef("gemm", "k"), (1,), x, n=5)
