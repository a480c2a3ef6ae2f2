"""The cluster-split decode GEMM candidates (``ops/gemm/cuda_decode_cluster.py``, ``kernels/cuda/gemm_decode_cluster.cu``):
every configuration against a float64 reference on the GPU (M from 1 to 16; K of one partial pass, of several chunks
per block, of fewer chunks than the cluster's blocks; N that leaves partial row groups; padded leading dimensions;
outputs pre-filled with NaN; NaN / inf in the operands; a CUDA graph), and on any machine how K is cut, what
they refuse and that the kernels compile."""

import pytest
import torch

from gemm_checks import check, nans, randn
from test_gemm_decode import _linear
from tunekit.backends import kernel_units, nvrtc
from tunekit.ops.gemm import AddmmParams, GemmParams, mm_op
from tunekit.ops.gemm.cuda_decode_cluster import CLUSTER_CONFIGS, CudaDecodeCluster, cluster_candidates

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_clusters = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                                    reason="needs a GPU with thread block clusters (sm_90 and later)")


def test_mm_lists_every_configuration():
    names = {c.name for c in mm_op.candidates}
    assert {f"cuda_decode_cluster_{c[0]}" for c in CLUSTER_CONFIGS} <= names


@pytest.mark.parametrize("cluster", [1, 2, 4, 8])
@pytest.mark.parametrize("most_k", [256, 512, 1024])
@pytest.mark.parametrize("K", [8, 32, 1000, 1024, 4096, 4104, 14336, 65536])
def test_chunks_cover_k_evenly_within_the_staged_size(cluster, most_k, K):
    c = CudaDecodeCluster("x", 1, 4, cluster, most_k)
    kc = c.chunk(K)
    chunks = -(-K // kc)
    per_block = -(-chunks // cluster)
    assert kc % 32 == 0 and 32 <= kc <= most_k
    assert per_block == -(-K // (cluster * most_k))  # no more chunks per block than the staged size forces
    assert chunks > (per_block - 1) * cluster  # the last round of chunks is not empty: no block waits a whole chunk


def test_chunks_of_the_suite_shapes():
    """K = 4096 across 4 blocks: one 1024 chunk each; K = 14336 across 4 or 8: 896 each (none left over)."""
    assert CudaDecodeCluster("x", 2, 4, 4, 1024).chunk(4096) == 1024
    assert CudaDecodeCluster("x", 1, 4, 8, 512).chunk(14336) == 448
    assert CudaDecodeCluster("x", 2, 8, 4, 1024).chunk(14336) == 896


def test_launch_shape_is_whole_clusters():
    c = CudaDecodeCluster("x", 2, 8, 4, 1024)
    a, b = _linear(16, 1000, 4096, torch.bfloat16, "cpu")
    grid, block, args = c.launch_shape(GemmParams(a, b), torch.empty(16, 1000, dtype=torch.bfloat16))
    assert (grid, block) == (-(-1000 // 128) * 4, 256) and args[-1] == 1024


def test_refusals_are_the_mma_forms():
    c = CudaDecodeCluster(*CLUSTER_CONFIGS[0])
    a, b = _linear(4, 64, 128, torch.bfloat16, "cpu")
    assert "needs a CUDA device" in c.supports(GemmParams(a, b))
    assert "M <= 16" in c.supports(GemmParams(*_linear(17, 64, 128, torch.bfloat16, "cpu")))
    assert "mm only" in c.supports(AddmmParams(torch.randn(64, dtype=torch.bfloat16), a, b))


@pytest.mark.skipif(nvrtc.available() is not None, reason="NVRTC unavailable")
@pytest.mark.parametrize("name", kernel_units.kernel_names("gemm_decode_cluster.cu"))
def test_every_kernel_compiles_for_hopper(name):
    """NVRTC builds each kernel's unit for sm_90 (no GPU needed): the cluster barrier, mapa and cp.async assemble."""
    code = kernel_units.kernel_source("gemm_decode_cluster.cu", name)
    image = nvrtc.compile_cubin(code, f"gemm_decode_cluster.cu:{name}", "sm_90",
                                identity=kernel_units.unit_identity("gemm_decode_cluster.cu", name))
    assert image[:4] == b"\x7fELF"


@gpu
@needs_clusters
@pytest.mark.parametrize("candidate", cluster_candidates(), ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M, N, K, ld", [(16, 4096, 4096, 0), (1, 1000, 1032, 8), (3, 37, 8, 0), (9, 517, 14336, 16),
                                         (2, 1, 264, 0), (16, 130, 4104, 8), (5, 300, 9000, 0), (12, 77, 40, 16)])
def test_every_configuration_against_float64(candidate, dtype, M, N, K, ld):
    a, b = _linear(M, N, K, dtype, "cuda", ld=ld, seed=M + N)
    p = GemmParams(a, b, nans((M, N), dtype, "cuda"))
    assert candidate.supports(p) is None
    assert candidate.run(p) is p.out
    check(p.out, a, b)
    fresh = candidate.run(GemmParams(a, b))  # a result it allocates
    assert torch.equal(fresh, p.out)  # sums in rank order, no atomics: the same bits


@gpu
@needs_clusters
@pytest.mark.parametrize("candidate", [CudaDecodeCluster(*c) for c in CLUSTER_CONFIGS[:3]], ids=lambda c: c.name)
def test_nan_and_inf_land_where_torch_puts_them(candidate):
    """Past a chunk's end the staged a and the loaded w are both zeros: an inf there never meets a zero."""
    M, K = 5, 2056
    a, b = _linear(M, 300, K, torch.bfloat16, "cuda")
    a[0, 7], a[M - 1, K - 1] = float("nan"), float("inf")
    b[K - 8, 42], b[11, 299] = float("-inf"), float("inf")
    p = GemmParams(a, b, nans((M, 300), torch.bfloat16, "cuda"))
    check(candidate.run(p), a, b)


@gpu
@needs_clusters
def test_replays_in_a_cuda_graph():
    c = CudaDecodeCluster(*CLUSTER_CONFIGS[0])
    a, b = _linear(16, 4096, 4096, torch.bfloat16, "cuda")
    out = nans((16, 4096), torch.bfloat16, "cuda")
    c.run(GemmParams(a, b, out))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c.run(GemmParams(a, b, out))
    out.fill_(float("nan"))
    a.copy_(randn((16, 4096), torch.bfloat16, "cuda", 7))
    graph.replay()
    torch.cuda.synchronize()
    check(out, a, b)
