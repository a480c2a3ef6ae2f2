"""quack's kernels shipped in the kernels bundle (backends/shipped_kernels.py, backends/quack.py): a bundle holds
the kernels a fresh quack cache built (complete folders only); a kernel the bundle holds is unpacked into the
cache (private files) instead of built, under kept builds only too (no compiler), and only
with shipped results on; a runtime library named where it lay on the machine that built the kernel is found
among the installed packages' files (not their stubs). On the CPU: the kernel's load is faked."""

import pathlib
import stat

import pytest
import torch

from test_shipped_kernels import pretuned, shipped_on  # noqa: F401 - a fixture
from tunekit.backends import quack, shipped_kernels
from tunekit.ops.gemm.quack_candidates import CONFIGS
from tunekit.tunable.preparations import NeedsCompiler, builds_only

FILES = {"kernel.so": b"\x7fELF a kernel", "recipe.json": b"[]",
         "libs.json": b'["/another/machine/nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so"]'}


def kernel_folder(root: pathlib.Path, key: str, files=FILES) -> pathlib.Path:
    folder = root / key
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def operands(pretuned, tmp_path, monkeypatch):  # noqa: F811 - the fixture imported above
    """(a, b, bias) of a bf16 linear, its kernel's key, the bundle holding that kernel; an empty quack cache."""
    monkeypatch.setattr(quack, "_environment", lambda index: "test-gpu")
    monkeypatch.setattr(quack, "_kernels", {})
    monkeypatch.setattr(quack, "_failed", {})
    monkeypatch.setattr(quack, "build", lambda specs: pytest.fail("built where the bundle holds the kernel"))
    a = torch.randn(1024, 64, dtype=torch.bfloat16)
    b = torch.randn(1024, 64, dtype=torch.bfloat16).t()
    bias = torch.randn(1024, dtype=torch.bfloat16)
    key = quack.spec_for(a, b, bias, "gelu_tanh", CONFIGS[0])["key"]
    kernel_folder(tmp_path / "built", key)
    shipped_kernels.write_bundle(pretuned / "GPU.kernels.zip", tmp_path / "none", None, None, None, tmp_path / "built")
    return a, b, bias, key


def test_a_bundle_holds_the_quack_kernels_a_fresh_cache_built(pretuned, tmp_path, monkeypatch):  # noqa: F811
    built = tmp_path / "quack"
    kernel_folder(built, "complete")
    kernel_folder(built, "half", {"kernel.so": FILES["kernel.so"]})  # a build that ended half-way
    kernel_folder(built, "not-elf", {**FILES, "kernel.so": b"MZ"})
    counts = shipped_kernels.write_bundle(pretuned / "GPU.kernels.zip", tmp_path / "none", None, None, None, built)
    assert counts == (0, 0, 0, 2)
    assert shipped_kernels.shipped_quack("complete") == FILES
    assert shipped_kernels.shipped_quack("half") is None and shipped_kernels.shipped_quack("not-elf") is None
    shipped_on(monkeypatch, False)
    assert shipped_kernels.shipped_quack("complete") is None


def test_a_shipped_kernel_is_unpacked_instead_of_built_even_under_kept_builds_only(operands, tmp_path, monkeypatch):
    a, b, bias, key = operands
    loaded = []
    monkeypatch.setattr(quack, "QuackKernel", lambda folder: loaded.append(folder) or object())
    with builds_only():
        kernel = quack.kernel_for(a, b, bias, "gelu_tanh", CONFIGS[0])
    folder = tmp_path / "cache" / "quack" / key
    assert loaded == [folder] and kernel is quack.kernel_for(a, b, bias, "gelu_tanh", CONFIGS[0])
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == FILES
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE((folder / name).stat().st_mode) == 0o600 for name in FILES)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{key}.")]  # no temporary folder left


def test_a_half_built_folder_gives_way_to_the_shipped_kernel(operands, tmp_path, monkeypatch):
    a, b, bias, key = operands
    kernel_folder(tmp_path / "cache" / "quack", key, {"recipe.json": b"[]"})  # no kernel.so: a build cut short
    monkeypatch.setattr(quack, "QuackKernel", lambda folder: object())
    quack.kernel_for(a, b, bias, "gelu_tanh", CONFIGS[0])
    assert (tmp_path / "cache" / "quack" / key / "kernel.so").read_bytes() == FILES["kernel.so"]


def test_without_shipped_results_the_bundles_kernel_is_not_used(operands, monkeypatch):
    a, b, bias, key = operands
    shipped_on(monkeypatch, False)
    with builds_only(), pytest.raises(NeedsCompiler):
        quack.kernel_for(a, b, bias, "gelu_tanh", CONFIGS[0])


class _Distribution:
    def __init__(self, root: pathlib.Path, names: list[str]):
        self.files = [_File(root, name) for name in names]


class _File(pathlib.PurePosixPath):
    def __new__(cls, root, name):
        f = super().__new__(cls, name)
        f.root_dir = root
        return f

    def locate(self):
        return self.root_dir / self


def test_a_runtime_library_from_another_machine_is_found_among_the_installed_packages_files(tmp_path, monkeypatch):
    files = ["nvidia_cutlass_dsl/cu12/lib/stubs/aarch64-unknown-linux-gnu/libcute_dsl_runtime.so",
             "nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so", "nvidia_cutlass_dsl/cu12/lib/libother.so"]
    dists = {"nvidia-cutlass-dsl-libs-cu12": _Distribution(tmp_path, files)}

    def distribution(name):
        if name not in dists:
            raise quack.importlib.metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(quack.importlib.metadata, "distribution", distribution)
    quack._installed_libraries.cache_clear()
    try:
        assert quack._installed_libraries() == {"libcute_dsl_runtime.so": str(tmp_path / files[1])}
        assert quack._library("/another/machine/lib/libcute_dsl_runtime.so") == str(tmp_path / files[1])
        here = tmp_path / "here" / "libcute_dsl_runtime.so"
        here.parent.mkdir()
        here.write_bytes(b"")
        assert quack._library(str(here)) == str(here)  # where the build found it, when it is there
        with pytest.raises(FileNotFoundError, match="libtvm_ffi.so"):
            quack._library("/another/machine/lib/libtvm_ffi.so")
    finally:
        quack._installed_libraries.cache_clear()
