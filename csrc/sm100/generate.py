#!/usr/bin/env python3
"""The SM100 dispatch table: the one place where kernel configs and the rule choosing them live.

Renders, from TABLE below:
  csrc/sm100/generated/<name>.cu           one TU per config holding its fp16, bf16 and fp32 kernels (the
                                           output dtype is picked at run time). Measured with nvcc 13.0 on
                                           this 2-core box: one TU with one dtype takes 110 s CPU / 4.5 GB,
                                           with all three 118 s / 5.0 GB -- the CUTLASS front end, not the
                                           kernel, dominates, so a TU per dtype would triple the build;
  csrc/sm100/generated/table.inc           the config list (names, parameters, selection rule) that
                                           select.cpp, api.cpp, nvfp4_gemm.configs() and the host tests use;
  csrc/sm100/generated/<grouped name>.cu   likewise one TU per grouped (mixture-of-experts) config, from
                                           GROUPED_TABLE (grouped_gemm.cuh: CUTLASS's ptr-array grouped kernel);
  csrc/sm100/generated/grouped_table.inc   the grouped config list that grouped_api.cpp and the host tests use.
The rendered files are committed; tests/test_sm100_generated.py fails if they differ from a fresh render.

    python csrc/sm100/generate.py           # rewrite generated/
    python csrc/sm100/generate.py --check   # exit 1 if generated/ is stale

Selection (dense): the first entry whose `m_max` >= M wins (the table is ordered by m_max). Every shape lands on
some entry: the last one has no bound. Numbers below assume B200 (148 SMs, 228 KB smem and 512 TMEM
columns per SM); stream-K entries adapt to the device's SM count at run time.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import generated_files  # noqa: E402  (csrc/generated_files.py)

OUT_DIR = os.path.join(HERE, "generated")

OUT_DTYPES = generated_files.OUT_DTYPES  # (file suffix, CUTLASS element, OutDtype enumerator)


@dataclass(frozen=True)
class Config:
    m_max: int | None     # chosen for M <= m_max (first match); None: no bound
    tile_m: int           # MMA tile rows (128: 1SM, 256: 2SM pair); tile K is always 256
    tile_n: int
    cluster_m: int
    cluster_n: int
    two_sm: bool
    stream_k: bool        # StreamKScheduler (heuristic decomposition) instead of the persistent default
    swap_ab: bool         # compute C^T = B A^T so that M lands on the MMA's N side
    why: str

    @property
    def name(self) -> str:
        s = (f"sm100_nvfp4_{self.tile_m}x{self.tile_n}x256_c{self.cluster_m}x{self.cluster_n}_"
             f"{'2sm' if self.two_sm else '1sm'}")
        if self.stream_k:
            s += "_sk"
        if self.swap_ab:
            s += "_swap"
        return s


TABLE = (
    # Decode and small batches. Unswapped, M <= 64 would fill at most half of the 128-row MMA; swapped,
    # the kernel's M is the weight's N (4096-7168 -> 32-56 tiles of 128 rows) and M sits on the MMA's N
    # side in one 64-wide tile (64 is the narrowest block-scaled N). 32-56 tiles cannot occupy 148 SMs,
    # and the op is bound by streaming B (N*K/2 bytes): CUTLASS's stream-K heuristic spreads the k-blocks
    # of under-half-a-wave grids over all SMs (>= 8 k-blocks per unit); K <= 2048 gets split-K from
    # Kernel::split_k instead. From N = 9472 up (74+ tiles) it runs data-parallel.
    # smem/stage: A 16 KB + B 8 KB + SF 4 KB -> ~7 stages deep; TMEM: 2 x 64 accumulator columns.
    Config(m_max=64, tile_m=128, tile_n=64, cluster_m=1, cluster_n=1, two_sm=False, stream_k=True,
           swap_ab=True,
           why="M<=64: swap A/B (M on the MMA N side, 64 wide); stream-K fills 148 SMs with 32-56 tiles"),
    # M = 65..128, the GPU MODE shapes (128 x 4096..7168 x 2048..16384): one 128-row tile, 32-56 tiles
    # of 128x128. Stream-K over K: (128,7168,16384) = 56 tiles x 64 k-blocks -> 24.2 k-blocks per SM,
    # (128,4096,7168) = 32 x 28 -> 6.1; (128,7168,2048) has only 8 k-blocks a tile, below the heuristic's
    # floor, so Kernel::split_k halves K there (112 CTAs). Streaming B is what bounds these shapes
    # (SOL 8.99 / 2.35 / 1.33 us). smem/stage 16+16+4 KB -> 5-6 stages; TMEM 2 x 128 accumulator columns
    # (double-buffered, so the fixup epilogue overlaps the next unit).
    Config(m_max=128, tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, two_sm=False, stream_k=True,
           swap_ab=False,
           why="M<=128 (GPU MODE): 128x128 tiles, 32-56 of them; stream-K splits K over all SMs"),
    # Medium M (129..1024) with LLM N (2048..8192): 256x128 on a CTA pair (each CTA holds 128 rows of A
    # and half of B's 128 columns), so B is read once per 256 rows. Tiles: M=256,N=4096 -> 32;
    # M=1024,N=7168 -> 224 = 3.03 waves of 74 pairs. Below one wave or with a ragged last wave,
    # stream-K's heuristic evens the SMs out; at full waves it runs data-parallel.
    # smem/stage per CTA 16+8+4 KB -> ~7 stages; TMEM 2 x 128 columns.
    Config(m_max=1024, tile_m=256, tile_n=128, cluster_m=2, cluster_n=1, two_sm=True, stream_k=True,
           swap_ab=False,
           why="129<=M<=1024: 2SM 256x128; stream-K evens out 0.4-3 waves of 74 CTA pairs"),
    # Large M: the biggest block-scaled tile, 256x256 on a pair (128 rows of A + 128 columns of B per CTA,
    # 2x the flops per byte of 256x128). M=2048,N=7168 -> 224 tiles = 3 waves; M=8192 -> 12 waves, where
    # the tail is small and stream-K's fixup traffic is not worth it: plain persistent scheduling.
    # smem/stage per CTA 16+16+6 KB -> ~5 stages; TMEM 256 columns, a single accumulator stage.
    Config(m_max=None, tile_m=256, tile_n=256, cluster_m=2, cluster_n=1, two_sm=True, stream_k=False,
           swap_ab=False,
           why="M>1024: 2SM 256x256 persistent; >= 3 waves, so no split of K"),
)


@dataclass(frozen=True)
class GroupedConfig:
    rows_max: int | None  # chosen while ceil(T / G) <= rows_max (first match); None: no bound
    tile_m: int           # 128: 1SM MMA (the grouped kernels use no CTA pairs); tile K is always 256
    tile_n: int
    swap_ab: bool         # D^T = B_g A_g^T: the group's rows on the MMA's N side
    why: str

    @property
    def name(self) -> str:
        return f"sm100_nvfp4_grouped_{self.tile_m}x{self.tile_n}x256_1sm" + ("_swap" if self.swap_ab else "")


# The grouped GEMM (nvfp4_gemm.grouped_mm): CUTLASS's ptr-array grouped block-scaled kernel, persistent over the
# SMs, with per-group problem shapes built on the device from offs (the host knows T, N, K, G only, so the rule
# reads the average rows per group ceil(T/G)). Each group is its own GEMM of m_g x N x K, so the MoE decode case
# (a few tokens per expert) is the dense small-M case once per group; 1SM tiles and no cluster keep one CTA per
# tile of one group. Two configs, each TU ~2 CPU-minutes to compile.
GROUPED_TABLE = (
    # Decode: a group's rows (tokens routed to one expert, typically 1-32) sit on the MMA's N side, 64 wide,
    # and N (the expert's output features) on its 128-row M side: N/128 tiles per non-empty group, each streaming
    # a 128 x K slice of the expert's weight once. Unswapped, the same tiles would run a 128-row MMA for a few
    # rows. smem/stage 16 + 8 + 4 KB as the dense swap entry.
    GroupedConfig(rows_max=64, tile_m=128, tile_n=64, swap_ab=True,
                  why="ceil(T/G)<=64 (decode): swap A/B, the group's rows on the 64-wide MMA N side"),
    # Prefill-sized groups: rows on the MMA's M side, 128x128 tiles (a group of m rows re-reads its weight
    # ceil(m/128) times instead of ceil(m/64) swapped).
    GroupedConfig(rows_max=None, tile_m=128, tile_n=128, swap_ab=False,
                  why="ceil(T/G)>64: 128x128 tiles, the group's rows on the MMA M side"),
)


def _grouped_cu(cfg: GroupedConfig) -> str:
    return generated_files.kernel_tu("sm100", "GROUPED_TABLE", cfg.why, "grouped_gemm.cuh",
                                     f"GroupedKernelOps kGroupedOps_{cfg.name}", "grouped_ops_of", "GroupedKernel",
                                     f"{cfg.tile_m}, {cfg.tile_n}, {str(cfg.swap_ab).lower()}")


def _grouped_table_inc() -> str:
    return generated_files.config_list(
        "sm100", "GROUPED_TABLE", "NVFP4_SM100_GROUPED_CONFIG", "name, rows_max (-1: none), tile_m, tile_n, swap_ab",
        ["// One line per grouped config, in selection order (first rows_max >= ceil(T/G) wins). Define the macro,",
         "// then include."],
        [(c.name, generated_files.bound(c.rows_max), c.tile_m, c.tile_n, int(c.swap_ab)) for c in GROUPED_TABLE])


def _cu(cfg: Config) -> str:
    params = (f"{cfg.tile_m}, {cfg.tile_n}, {cfg.cluster_m}, {cfg.cluster_n}, {str(cfg.two_sm).lower()}, "
              f"{str(cfg.stream_k).lower()}, {str(cfg.swap_ab).lower()}")
    return generated_files.kernel_tu("sm100", "the table", cfg.why, "sm100_gemm.cuh", f"KernelOps kOps_{cfg.name}",
                                     "ops_of", "Kernel", params)


def _table_inc() -> str:
    return generated_files.config_list(
        "sm100", "the table", "NVFP4_SM100_CONFIG",
        "name, m_max (-1: none), tile_m, tile_n, cluster_m, cluster_n, two_sm, stream_k, swap_ab",
        ["// One line per config, in selection order (first m_max >= M wins). Define the macro, then include."],
        [(c.name, generated_files.bound(c.m_max), c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, int(c.two_sm),
          int(c.stream_k), int(c.swap_ab)) for c in TABLE])


def render() -> dict[str, str]:
    assert all(a.m_max is not None and (b.m_max is None or a.m_max < b.m_max) for a, b in zip(TABLE, TABLE[1:])), \
        "TABLE must be ordered by m_max, unbounded last"
    assert TABLE[-1].m_max is None, "the last entry must take every remaining M"
    files = {"table.inc": _table_inc()}
    assert [e for _, _, e in OUT_DTYPES] == ["kFloat16", "kBFloat16", "kFloat32"], "OutDtype order"
    for c in TABLE:
        files[f"{c.name}.cu"] = _cu(c)
    assert all(a.rows_max is not None and (b.rows_max is None or a.rows_max < b.rows_max)
               for a, b in zip(GROUPED_TABLE, GROUPED_TABLE[1:])), "GROUPED_TABLE must be ordered by rows_max"
    assert GROUPED_TABLE[-1].rows_max is None, "the last grouped entry must take every remaining T/G"
    files["grouped_table.inc"] = _grouped_table_inc()
    for c in GROUPED_TABLE:
        files[f"{c.name}.cu"] = _grouped_cu(c)
    return files


def main() -> int:
    return generated_files.main(__doc__, render, OUT_DIR)


if __name__ == "__main__":
    sys.exit(main())
