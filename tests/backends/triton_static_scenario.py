"""A process for tests/backends/test_triton_static.py: runs Triton candidates twice and reports, as
one JSON line, whether both calls gave the same bits, how many kernels were kept, whether Triton was
imported (before the TMA kernel, whose launcher imports it for its allocator) and a digest of the
results (equal across processes: the kept cubin gives Triton's bits)."""

import hashlib
import json
import sys

import torch

from tunekit.backends import triton_static
from tunekit.ops.gemm import GemmParams
from tunekit.ops.gemm.triton_candidates import TritonGemm, _config
from tunekit.ops.logsumexp.params import LogsumexpParams
from tunekit.ops.logsumexp.triton_forward import TritonRows


def twice(candidate, params):
    first = candidate.run(params).clone()
    torch.cuda.synchronize()
    second = candidate.run(params)
    torch.cuda.synchronize()
    return torch.equal(first, second), first


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(3000, 777, device="cuda", generator=g)
    a = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(520, 260, device="cuda", dtype=torch.bfloat16, generator=g)
    # a contiguous input 4 bytes past an aligned address: Triton's other specialization, kept apart
    shifted = torch.randn(3000 * 777 + 1, device="cuda", generator=g)[1:].view(3000, 777)
    rows = TritonRows("rows", "logsumexp_rows_kernel", block=1024, rows_per_program=1)
    runs = [(rows, LogsumexpParams(x, (1,))), (rows, LogsumexpParams(shifted, (1,))),
            (TritonGemm("matmul", _config(64, 64, 32, 4, 3)), GemmParams(a, b))]
    results = [twice(c, p) for c, p in runs]
    reference = torch.logsumexp(shifted.double(), 1)
    close = torch.allclose(results[1][1].double(), reference, rtol=1e-5, atol=1e-5)
    imported = "triton" in sys.modules
    if torch.cuda.get_device_capability() >= (9, 0):
        a2 = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16, generator=g)
        b2 = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16, generator=g)
        results.append(twice(TritonGemm("tma", _config(128, 128, 64, 8, 3)), GemmParams(a2, b2)))
    kept = [v for v in triton_static._table.values() if isinstance(v, triton_static._Loaded)]
    cubins = {v.recipe.cubin for v in kept}
    digest = hashlib.sha256(b"".join(r.float().cpu().numpy().tobytes() for _, r in results)).hexdigest()
    print(json.dumps({"same": all(s for s, _ in results) and close, "kernels": len(results), "kept": len(kept),
                      "triton_imported": imported, "digest": digest,
                      "cubins": len(cubins)}))


if __name__ == "__main__":
    main()
