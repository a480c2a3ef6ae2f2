"""Timing probe, not a candidate: where the 16-bit split rows lose their last ~2 us, three ways.

A. The second pass: each split library candidate timed alone and followed by its combine kernel
   (64x1M and 4x16M rows, dim 0 of 4096x4096), to price the merge pass.
B. Ablation: one kernel source, a copy of the library's chunks kernel (one block per 32 KB chunk of
   a 16-bit row, logsumexp.cu), in which each of the library's features can be switched to the bare
   probe's form (benchmarks/experiments/probe_logsumexp_kernel.py) by a macro: SHIFT (shift_of in the fold: 0
   for a max of +-inf), EPI (block_reduce: merges by shuffles in every warp, then warp 0; 0: the
   probe's serial loop in thread 0), TAIL (fold_range's guarded main loop and its tail loop; 0:
   one unguarded loop), ADDR (row and split from blockIdx.x by a 64-bit division, offsets from
   row * cols; 0: blockIdx.x * chunk), EMIT (emit()'s splits test and split-major partials; 0:
   partials[blockIdx.x]). All on should time as the library's chunks kernel (also timed, compiled
   from logsumexp.cu by the same compiler); each variant switches one feature off, then one on.
C. Fused merge: FUSE=1 makes the last block of each row (a per-row arrival counter, reset by that
   block) merge the row's partials and write the result, instead of a second kernel.
D. What the library took from A-C: ADDR=2 (chunks tile the rows: a chunk starts at blockIdx.x *
   chunk, no division), row-major partials (EMIT=2), and the merge pass as a programmatic dependent
   launch (cuLaunchKernelEx; TRIGGER=1: griddepcontrol.launch_dependents at the kernel's start).

Timed as the earlier probe: CUDA events over CUDA-graph replay of 40 calls rotating 8 buffers of
128 MiB (L2-cold), median of 6. Needs cupy (the device image has it):
``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_ablation.py [PARTS]`` (PARTS: letters, default ABCD). Results:
``benchmarks/results/logsumexp_rows_experiments-NVIDIA_H200.md``."""
import sys

import cupy as cp
import torch

from tunekit.backends import nvrtc
from tunekit.ops.logsumexp import LogsumexpParams, logsumexp_op
from tunekit.backends.device import sm_count
from tunekit.ops.logsumexp.cuda_common import BLOCK, combine_grid
from tunekit.ops.logsumexp.cuda_forward import CudaRows
from tunekit.bench.measure import copy_bandwidth
from probe_timing import timed

SRC = r'''
#include <cuda_fp16.h>
#define INF __int_as_float(0x7f800000)
constexpr float LOG2E = 1.44269504088896340736f;
constexpr int BLOCK = 256, VEC = 8, UNROLL = 4;
constexpr long long STEP = BLOCK * VEC;
struct P { float m, s; };
__device__ __forceinline__ float ex2(float v) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }
__device__ __forceinline__ float shift_of(float m) {
#if SHIFT
  return fabsf(m) == INF ? 0.0f : m;
#else
  return m;
#endif
}
template <int N> __device__ __forceinline__ void fold(P& p, const float (&v)[N]) {
  float tm = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) tm = fmaxf(tm, v[k]);
  const float m = fmaxf(p.m, tm);
  const float off = -shift_of(m) * LOG2E;
  float s = p.s * ex2(fmaf(p.m, LOG2E, off));
#pragma unroll
  for (int k = 0; k < N; ++k) s += ex2(fmaf(v[k], LOG2E, off));
  p = P{m, s};
}
__device__ __forceinline__ P merge(P a, P b) {
  const float m = fmaxf(a.m, b.m);
  const float off = -shift_of(m) * LOG2E;
  return P{m, fmaf(a.s, ex2(fmaf(a.m, LOG2E, off)), b.s * ex2(fmaf(b.m, LOG2E, off)))};
}
template <int W> __device__ __forceinline__ P group_reduce(P p) {
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) {
    P q{__shfl_xor_sync(~0u, p.m, o, W), __shfl_xor_sync(~0u, p.s, o, W)};
    p = merge(p, q);
  }
  return p;
}
__device__ __forceinline__ void tile(P& p, const __half* r, long long c) {
  uint4 pk[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) pk[u] = *reinterpret_cast<const uint4*>(r + c + u * STEP);
  float v[UNROLL * VEC];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const __half* e = reinterpret_cast<const __half*>(&pk[u]);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[u * VEC + k] = __half2float(e[k]);
  }
  fold(p, v);
}
extern "C" __global__ void __launch_bounds__(BLOCK)
ablation(const __half* x, __half* out, float2* partials, unsigned* counters, long long n_rows, long long cols,
         long long chunk, long long splits) {
  __shared__ P scratch[BLOCK / 32];
#if ADDR == 1
  const long long row = blockIdx.x / splits;
  const long long split = blockIdx.x - row * splits;
  const long long begin = split * chunk;
  const long long end = begin + chunk < cols ? begin + chunk : cols;
  const __half* r = x + row * cols;
#elif ADDR == 2
  // flat: chunks tile every row exactly (cols == splits * chunk), so a chunk's start needs no division
  const long long row = 0, split = 0;
  const long long begin = 0, end = chunk;
  const __half* r = x + static_cast<long long>(blockIdx.x) * chunk;
#else
  const long long row = blockIdx.x >> 6, split = blockIdx.x & 63;  // 64 splits in this probe
  const long long begin = 0, end = chunk;
  const __half* r = x + blockIdx.x * chunk;
#endif
#if TRIGGER
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  P p{-INF, 0.0f};
  long long c = begin + threadIdx.x * VEC;
#if TAIL
  for (; c + (UNROLL - 1) * STEP < end; c += UNROLL * STEP) tile(p, r, c);
  for (; c < end; c += STEP) {
    const uint4 pk = *reinterpret_cast<const uint4*>(r + c);
    const __half* e = reinterpret_cast<const __half*>(&pk);
    float v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = __half2float(e[k]);
    fold(p, v);
  }
#else
  for (; c < end; c += UNROLL * STEP) tile(p, r, c);
#endif
#if EPI
  p = group_reduce<32>(p);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = p;
  __syncthreads();
  if (threadIdx.x < 32) {
    p = threadIdx.x < BLOCK / 32 ? scratch[threadIdx.x] : P{-INF, 0.0f};
    p = group_reduce<BLOCK / 32>(p);
  }
#else
  p = group_reduce<32>(p);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = p;
  __syncthreads();
  if (threadIdx.x == 0) for (int i = 1; i < BLOCK / 32; ++i) p = merge(p, scratch[i]);
#endif
#if FUSE
  if (threadIdx.x < 32) {
    unsigned last = 0;
    if (threadIdx.x == 0) {
      partials[split * n_rows + row] = make_float2(p.m, p.s);
      __threadfence();
      last = atomicAdd(counters + row, 1u) == splits - 1;
    }
    if (__shfl_sync(~0u, last, 0)) {
      __threadfence();
      P t{-INF, 0.0f};
      for (long long k = threadIdx.x; k < splits; k += 32) {
        const float2 q = __ldcg(partials + k * n_rows + row);
        t = merge(t, P{q.x, q.y});
      }
      t = group_reduce<32>(t);
      if (threadIdx.x == 0) {
        out[row] = __float2half_rn(shift_of(t.m) + logf(t.s));
        counters[row] = 0;
      }
    }
  }
#elif EMIT == 2
  if (threadIdx.x == 0) partials[blockIdx.x] = make_float2(p.m, p.s);  // row-major: [row][split]
#elif EMIT
  if (threadIdx.x == 0) {
    if (splits == 1) out[row] = __float2half_rn(shift_of(p.m) + logf(p.s));
    else partials[split * n_rows + row] = make_float2(p.m, p.s);
  }
#else
  if (threadIdx.x == 0) partials[blockIdx.x] = make_float2(p.m, p.s);
#endif
}

// partials row-major ([row][split]), a warp per result; waits for the grid it depends on
// (a no-op unless launched with programmatic stream serialization)
extern "C" __global__ void __launch_bounds__(BLOCK)
combine_rows(const float2* partials, __half* out, long long n, long long splits) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int lane = threadIdx.x % 32;
  const long long j = static_cast<long long>(blockIdx.x) * (BLOCK / 32) + threadIdx.x / 32;
  if (j >= n) return;
  P t{-INF, 0.0f};
  // 4 loads in flight per lane: a serial load-then-merge loop over 1024 splits cost ~5 us
  for (long long k = lane; k < splits; k += 4 * 32) {
    float2 q[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) q[u] = k + u * 32 < splits ? partials[j * splits + k + u * 32] : make_float2(-INF, 0.0f);
#pragma unroll
    for (int u = 0; u < 4; ++u) t = merge(t, P{q[u].x, q[u].y});
  }
  t = group_reduce<32>(t);
  if (lane == 0) out[j] = __float2half_rn(shift_of(t.m) + logf(t.s));
}
'''

FEATURES = ("SHIFT", "EPI", "TAIL", "ADDR", "EMIT")


def compile_variant(flags: dict) -> cp.RawKernel:
    opts = ("-std=c++17", "--gpu-architecture=sm_90", *(f"-D{k}={v}" for k, v in {"TRIGGER": 0, **flags}.items()))
    return cp.RawModule(code=SRC, options=opts).get_function("ablation")


class DriverKernels:
    """The probe's kernels loaded through the driver, launched by cuLaunchKernelEx: optionally with
    programmatic stream serialization (PDL: the dependent kernel may start before this one ends and
    waits in griddepcontrol.wait)."""

    def __init__(self, flags: dict):
        from cuda.bindings import driver
        self.driver = driver
        opts = tuple(f"-D{k}={v}" for k, v in {"TRIGGER": 0, **flags}.items())
        cubin = nvrtc.compile_cubin(SRC, "ablation.cu", "sm_90", opts, use_cache=False)
        torch.cuda.current_stream()
        err, self.module = driver.cuModuleLoadData(cubin)
        assert int(err) == 0, err
        self.fns = {}
        for name in ("ablation", "combine_rows"):
            err, self.fns[name] = driver.cuModuleGetFunction(self.module, name.encode())
            assert int(err) == 0, err

    def launch(self, name, grid, args, pdl=False):
        import ctypes
        d = self.driver
        holders = [ctypes.c_uint64(a if isinstance(a, int) else a.data_ptr()) for a in args]
        array = (ctypes.c_void_p * len(args))(*[ctypes.addressof(h) for h in holders])
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 256, 1, 1
        cfg.sharedMemBytes = 0
        cfg.hStream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        if pdl:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        else:
            cfg.numAttrs = 0
        (err,) = d.cuLaunchKernelEx(cfg, self.fns[name], ctypes.addressof(array), 0)
        assert int(err) == 0, err


def part_a(bufs16, bufs32) -> None:
    print("\n## A. split candidates alone and with their combine kernel (us)\n")
    print("| candidate | shape | grid | splits | kernel alone | + combine | combine's share |")
    print("|---|---|---:|---:|---:|---:|---:|")
    cases = [("logsumexp_block_split_f16_vec", (64, 1 << 20), -1, bufs16),
             ("logsumexp_chunks32k_f16", (64, 1 << 20), -1, bufs16),
             ("logsumexp_block_split_f16_vec", (4, 1 << 24), -1, bufs16),
             ("logsumexp_columns_f32", (4096, 4096), 0, bufs32),
             ("logsumexp_columns_narrow_f16_vec", (4096, 4096), 0, bufs16),
             ("logsumexp_columns_f32", (32, 4096, 128), 1, bufs32)]
    for name, shape, dim, bufs in cases:
        c = logsumexp_op.candidate(name)
        numel = 1
        for s in shape:
            numel *= s
        views = [b[:numel].view(shape) for b in bufs]
        ps = [LogsumexpParams(v, (dim % len(shape),), False, None) for v in views]
        for q in ps:
            q.out = q.new_outputs()["out"]
        if isinstance(c, CudaRows):
            index, grid, rows, cols, chunk, splits = c._work(ps[0], split={} if c.split else None)
            n_out, args = rows, (rows, cols, chunk, splits)
        else:
            index, grid, outer, R, inner, chunk, splits = c._work(ps[0])
            n_out, args = outer * inner, (outer, R, inner, chunk, splits)
        part = torch.empty((splits, n_out, 2), dtype=torch.float32, device="cuda")
        alone = timed(lambda i: c.kernel.launch(index, grid, BLOCK, ps[i % 8].x, ps[i % 8].out, part, *args))
        both = timed(lambda i: c.run(ps[i % 8]))
        print(f"| {name} | {'x'.join(map(str, shape))}:{dim} | {grid} | {splits} | {alone:.2f} | {both:.2f} | "
              f"{both - alone:.2f} |")


def part_bc(bufs16) -> None:
    rows, cols, chunk = 64, 1 << 20, 16384
    splits = cols // chunk
    views = [b[:rows * cols].view(rows, cols) for b in bufs16]
    out = torch.empty(rows, dtype=torch.float16, device="cuda")
    part = torch.empty((splits, rows, 2), dtype=torch.float32, device="cuda")
    counters = torch.zeros(rows, dtype=torch.int32, device="cuda")
    lib = logsumexp_op.candidate("logsumexp_chunks32k_f16")
    lib_mod = cp.RawModule(code=nvrtc.source("logsumexp.cu"), options=("-std=c++17", "--gpu-architecture=sm_90",
                           *(f"-I{d}" for d in nvrtc.include_dirs())))
    lib_fn = lib_mod.get_function("logsumexp_chunks_f16")
    comb = lib.combine

    def launcher(fn, fused=False, with_combine=False):
        def call(i):
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn((rows * splits,), (256,), (views[i % 8].data_ptr(), out.data_ptr(), part.data_ptr(),
                                              counters.data_ptr(), cp.int64(rows), cp.int64(cols),
                                              cp.int64(chunk), cp.int64(splits)))
            if with_combine:
                comb.launch(0, combine_grid(rows, sm_count(0)), 256, part, out, rows, splits)
        return call

    def lib_call(i, with_combine):
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            lib_fn((rows * splits,), (256,), (views[i % 8].data_ptr(), out.data_ptr(), part.data_ptr(),
                                              cp.int64(rows), cp.int64(cols), cp.int64(chunk), cp.int64(splits)))
        if with_combine:
            comb.launch(0, combine_grid(rows, sm_count(0)), 256, part, out, rows, splits)

    print("\n## B. ablation, float16 64x1048576, one block per 32 KB chunk (us; 1 = the library's form)\n")
    print("| variant | " + " | ".join(FEATURES) + " | kernel alone | + combine kernel |")
    print("|---|" + "---|" * len(FEATURES) + "---:|---:|")
    print("| library logsumexp_chunks_f16 (cupy) | " + " | ".join("1" for _ in FEATURES) +
          f" | {timed(lambda i: lib_call(i, False)):.2f} | {timed(lambda i: lib_call(i, True)):.2f} |")
    variants = [("all on", {f: 1 for f in FEATURES}), ("all off (the probe)", {f: 0 for f in FEATURES})]
    variants += [(f"{f} off", {g: int(g != f) for g in FEATURES}) for f in FEATURES]
    variants += [(f"{f} on", {g: int(g == f) for g in FEATURES}) for f in FEATURES]
    for label, flags in variants:
        fn = compile_variant({**flags, "FUSE": 0})
        alone = timed(launcher(fn))
        both = timed(launcher(fn, with_combine=True))
        print(f"| {label} | " + " | ".join(str(flags[f]) for f in FEATURES) + f" | {alone:.2f} | {both:.2f} |")

    print("\n## C. fused merge: the last block of a row merges its partials (us)\n")
    print("| variant | fused, one kernel | unfused + combine kernel | results match torch |")
    print("|---|---:|---:|---|")
    for label, flags in (("all on", {f: 1 for f in FEATURES}), ("all off but ADDR, EMIT", {"SHIFT": 0, "EPI": 0, "TAIL": 0, "ADDR": 1, "EMIT": 1})):
        fused = compile_variant({**flags, "FUSE": 1})
        unfused = compile_variant({**flags, "FUSE": 0})
        call = launcher(fused, fused=True)
        out.fill_(float("nan"))
        call(0)
        torch.cuda.synchronize()
        ref = torch.logsumexp(views[0].double(), -1)
        ok = torch.allclose(out.double(), ref, rtol=2e-3, atol=2e-3) and int(counters.abs().sum()) == 0
        f_us = timed(call)
        u_us = timed(launcher(unfused, with_combine=True))
        print(f"| {label} | {f_us:.2f} | {u_us:.2f} | {'yes' if ok else 'NO'} |")


def part_d(bufs16) -> None:
    print("\n## D. no division before the loads (flat chunks, row-major partials) and a PDL combine (us)\n")
    print("| shape | variant | kernel alone | + combine | + combine, PDL | + combine, PDL, early trigger | results match torch |")
    print("|---|---|---:|---:|---:|---:|---|")
    chunk = 16384
    for rows, cols in ((64, 1 << 20), (4, 1 << 24)):
        splits = cols // chunk
        views = [b[:rows * cols].view(rows, cols) for b in bufs16]
        out = torch.empty(rows, dtype=torch.float16, device="cuda")
        part = torch.empty((rows, splits, 2), dtype=torch.float32, device="cuda")
        n_comb = -(-rows // 8)
        for label, flags in (("library form, row-major partials", {"SHIFT": 1, "EPI": 1, "TAIL": 1, "ADDR": 1, "EMIT": 2}),
                             ("flat", {"SHIFT": 1, "EPI": 1, "TAIL": 1, "ADDR": 2, "EMIT": 2})):
            plain = DriverKernels({**flags, "FUSE": 0})
            trig = DriverKernels({**flags, "FUSE": 0, "TRIGGER": 1})

            def call(kernels, i, combine, pdl):
                kernels.launch("ablation", rows * splits, (views[i % 8], out, part, 0, rows, cols, chunk, splits))
                if combine:
                    kernels.launch("combine_rows", n_comb, (part, out, rows, splits), pdl=pdl)

            out.fill_(float("nan"))
            call(trig, 0, True, True)
            torch.cuda.synchronize()
            ref = torch.logsumexp(views[0].double(), -1)
            ok = torch.allclose(out.double(), ref, rtol=2e-3, atol=2e-3)
            cells = [timed(lambda i: call(plain, i, False, False)), timed(lambda i: call(plain, i, True, False)),
                     timed(lambda i: call(plain, i, True, True)), timed(lambda i: call(trig, i, True, True))]
            print(f"| {rows}x{cols} | {label} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {'yes' if ok else 'NO'} |")


def main() -> None:
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}; copy (1 GiB, read + write): {copy_bandwidth(torch.device('cuda')):.0f} GB/s")
    n16 = 64 << 20  # 128 MiB of 16-bit, 64 x 1M or 4 x 16M
    bufs16 = [torch.randn(n16, device="cuda", dtype=torch.float16) * 3 for _ in range(8)]
    parts = sys.argv[1] if len(sys.argv) > 1 else "ABCD"
    if "D" in parts:
        part_d(bufs16)
    if "B" in parts or "C" in parts:
        part_bc(bufs16)
    if "A" in parts:
        n32 = 16 << 20  # 64 MiB of float32: 4096 x 4096
        bufs32 = [torch.randn(n32, device="cuda") * 3 for _ in range(8)]
        part_a(bufs16, bufs32)


if __name__ == "__main__":
    main()
