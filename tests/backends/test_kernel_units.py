"""One kernel as its own translation unit (tunekit.backends.kernel_units): the macro expander on its
own, then against NVRTC: every file's expanded kernels are exactly the kernels its whole compile
defines, and a kernel's unit holds that kernel alone, as the same machine code. No GPU needed."""

from __future__ import annotations

import time
from importlib import resources

import pytest

from cubin_elf import entry_points, sections
from tunekit.backends import kernel_units, nvrtc
from tunekit.backends.kernel_units import UnitError, expand

SOURCES = sorted(p.name for p in resources.files("tunekit.kernels.cuda").iterdir() if p.name.endswith(".cu"))

needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC unavailable: {nvrtc.available()}")


def _expand(text: str, defines: str) -> str:
    macros = kernel_units._macros(kernel_units._clean(defines))
    return kernel_units._join(expand(kernel_units._tokens(text), macros))


def test_pasting_substitution_and_rescanning_follow_the_preprocessor():
    defines = """
#define LEAF(name, T, N) extern "C" void name(T* x) { f<T, N>(x); }
#define FORMS(DEF, prefix, T) \\
  DEF(prefix##_a, T, 1) /* a comment */ \\
  DEF(prefix##_b##_vec, T, 2)
#define TWICE(x) x x
"""
    out = _expand("FORMS(LEAF, silu, float)", defines)
    assert out == ('extern "C" void silu_a(float* x) { f<float, 1>(x); } '
                   'extern "C" void silu_b_vec(float* x) { f<float, 2>(x); }')
    # arguments are expanded before substitution, except next to ##; nested parentheses keep commas
    assert _expand("TWICE(TWICE(y))", defines) == "y y y y"
    assert _expand("LEAF(k, g(a, b), 3)", defines) == 'extern "C" void k(g(a, b)* x) { f<g(a, b), 3>(x); }'
    # a macro name not followed by "(" stays as it is; a macro does not expand inside itself
    assert _expand("LEAF + TWICE", defines) == "LEAF + TWICE"
    assert _expand("SELF(1)", "#define SELF(x) SELF(x)") == "SELF(1)"


@pytest.mark.parametrize("defines, call, message", [
    ("#define S(x) #x", "S(a)", "stringizing"),
    ("#define P(x) x##_y", "P()", "empty argument"),
    ("#define TWO(a, b) a b", "TWO(1)", "takes 2 arguments"),
    ("#define E(x) x(", "E(1", "unterminated"),
    ("#define F(x) x\n#define G(x) F", "G(1)(2)", "ends in the macro name F"),
    ("#define Q(x) x##+", "Q(a)", "not one token"),
])
def test_what_the_expander_does_not_support_is_an_error(defines, call, message):
    with pytest.raises(UnitError, match=message):
        _expand(call, defines)


def test_every_source_has_an_instantiation_section_and_kernels():
    for filename in SOURCES:
        names = kernel_units.kernel_names(filename)
        assert names, filename
        assert kernel_units.GUARD in nvrtc.source(filename)
    assert len(kernel_units.kernel_names("silu.cu")) == 32  # 16 forms, forward and backward
    assert len(kernel_units.kernel_names("gelu.cu")) == 64


def test_a_kernel_unit_is_the_file_without_its_section_then_the_one_definition():
    text = kernel_units.kernel_source("silu.cu", "silu_f16x8_pack")
    assert text.startswith(f"#define {kernel_units.GUARD}\n") and nvrtc.source("silu.cu") in text
    tail = text.split("the one kernel of this unit ----\n", 1)[1]
    assert tail.count('extern "C"') == 1 and " silu_f16x8_pack(const __half* x, __half* y, long long n)" in tail
    with pytest.raises(UnitError, match="defines no kernel silu_f99"):
        kernel_units.kernel_source("silu.cu", "silu_f99")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """Each file compiled whole for sm_90 (the cache in a temporary folder: no earlier run counts)."""
    cache = tmp_path_factory.mktemp("cubins")
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNEKIT_CACHE", str(cache))
    try:
        yield {f: nvrtc.compile_cubin(nvrtc.source(f), f, "sm_90") for f in SOURCES}
    finally:
        mp.undo()


@needs_nvrtc
@pytest.mark.parametrize("filename", SOURCES)
def test_the_expander_finds_exactly_the_kernels_of_the_whole_compile(whole, filename):
    assert set(kernel_units.kernel_names(filename)) == entry_points(whole[filename])


#: one kernel per file and macro family (elementwise forms unary / binary, consecutive / strided, per
#: storage type; logsumexp rows, chunks, row blocks, columns, strips, combines; the gradient's rows,
#: columns, flat)
SAMPLE = [
    ("silu.cu", "silu_f32"), ("silu.cu", "silu_f16x8_pack_x2"), ("silu.cu", "silu_backward_bf16x8"),
    ("gelu.cu", "gelu_f16x8"), ("gelu.cu", "gelu_tanh_bf16x8_pack_x4"), ("gelu.cu", "gelu_backward_f32x4"),
    ("logsumexp.cu", "logsumexp_warp_f16_vec"), ("logsumexp.cu", "logsumexp_chunks_bf16"),
    ("logsumexp.cu", "logsumexp_rowblock128_f32_vec"), ("logsumexp.cu", "logsumexp_columns_narrow_f16_vec"),
    ("logsumexp.cu", "logsumexp_columns_strip_f32_vec"), ("logsumexp.cu", "logsumexp_combine_wide_bf16"),
    ("logsumexp_backward.cu", "logsumexp_backward_rows8_f32"),
    ("logsumexp_backward.cu", "logsumexp_backward_columns_f16_vec"),
    ("logsumexp_backward.cu", "logsumexp_backward_flat_bf16_vec_x2"),
]


@needs_nvrtc
@pytest.mark.parametrize("filename, name", SAMPLE)
def test_a_kernel_compiles_alone_to_the_machine_code_of_the_whole_file(whole, filename, name):
    cubin = nvrtc.compile_cubin(kernel_units.kernel_source(filename, name), f"{filename}:{name}", "sm_90",
                                use_cache=False)
    assert entry_points(cubin) == {name}
    assert sections(cubin)[f".text.{name}"] == sections(whole[filename])[f".text.{name}"]


@needs_nvrtc
def test_every_candidate_kernel_of_an_op_compiles_alone_quickly():
    """silu's float16 candidates' kernels, each alone: what a first call of a new float16 signature
    compiles. Each one well under the whole file's seconds."""
    import torch

    from tunekit.ops.silu import silu_op

    kernels = sorted({c.kernel.name for c in silu_op.candidates
                      if getattr(c, "dtype", None) == torch.float16 and hasattr(c, "kernel")})
    assert len(kernels) >= 6
    nvrtc.compile_cubin(kernel_units.kernel_source("silu.cu", kernels[0]), "warm-up", "sm_90", use_cache=False)
    for name in kernels:
        start = time.perf_counter()
        cubin = nvrtc.compile_cubin(kernel_units.kernel_source("silu.cu", name), name, "sm_90", use_cache=False)
        took = time.perf_counter() - start
        assert entry_points(cubin) == {name}
        assert took < 1.0, f"{name}: {took:.2f} s alone"
